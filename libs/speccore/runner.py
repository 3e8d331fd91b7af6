"""Runs a Hugging Face causal LM over one block of tokens per row.

The block is a tree (a chain for prefill and plain decoding): each node sees the
row's committed context plus its own ancestors, at position
``committed_length + depth``. Masks are built here, so the model's own mask
logic (which assumes one shared cache length) is bypassed. Llama-family models on
the row-invariant CPU kernels run through ``speccore.decoder`` (same bits, less
overhead); every other model through its Hugging Face modules.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from speccore import cpu_kernels
from speccore.decoder import LeanDecoder
from speccore.features import LayerTap, check_feature_layers
from speccore.kv_cache import StaticKVCache
from speccore.tree import ancestor_mask, depths


def pad_rows(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token block [batch, max(1, longest row)] and each row's length [batch]."""
    counts = torch.tensor([len(r) for r in rows], dtype=torch.long)
    tokens = torch.zeros(len(rows), max(int(counts.max()), 1), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens, counts


class ModelRunner:
    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        self.model = model
        self.backbone = model.base_model
        # None for a bare decoder (an EAGLE head's layer): such a model only gives hidden states.
        self.head: nn.Module | None = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.softcap: float | None = getattr(config, "final_logit_softcapping", None)
        layer_types = getattr(config, "layer_types", None) or []
        self.sliding_window: int | None = (
            config.sliding_window if "sliding_attention" in layer_types else None
        )
        # The row-invariant CPU attention takes its mask folded once per forward, not per layer.
        self.fold_groups: int | None = None
        if config._attn_implementation == cpu_kernels.ATTENTION_NAME:
            self.fold_groups = config.num_attention_heads // config.num_key_value_heads
        self.lean = LeanDecoder.build(model)
        layers: Any = self.backbone.layers
        self.n_layers = len(layers)

    def check_taps(self, taps: tuple[int, ...]) -> None:
        """Refuse decoder-layer taps this model cannot give (see features.check_feature_layers)."""
        check_feature_layers(taps, self.n_layers)

    def new_cache(self, batch: int, capacity: int) -> StaticKVCache:
        return StaticKVCache(batch, capacity, self.device, self.dtype)

    @torch.inference_mode()
    def forward(
        self,
        cache: StaticKVCache,
        tokens: torch.Tensor | None,
        block_parents: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [batch, q, hidden].

        tokens: [batch, q], or None with embeds: [batch, q, hidden] input embeddings
        instead; block_parents: [batch, q] block-relative parents (-1 for a root), or
        None for a chain. Writes the block's keys/values after each row's committed
        length without committing them.
        """
        return self.forward_tapped(cache, tokens, block_parents, embeds)[0]

    @torch.inference_mode()
    def forward_tapped(
        self,
        cache: StaticKVCache,
        tokens: torch.Tensor | None,
        block_parents: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward``, and the outputs of the decoder layers ``taps`` concatenated in
        the order asked ([batch, q, len(taps) * hidden]; None without taps)."""
        inputs = tokens if tokens is not None else embeds
        if inputs is None or (tokens is not None and embeds is not None):
            raise ValueError("give either tokens or embeds")
        batch, q = inputs.shape[:2]
        with self.small_ops(batch * q):
            if block_parents is None:
                anc = torch.tril(torch.ones(q, q, dtype=torch.bool)).expand(batch, q, q)
            else:
                anc = ancestor_mask(block_parents)
            width = cache.begin_block(q)
            lengths = cache.lengths
            positions = lengths[:, None] + depths(anc)  # [batch, q]
            block_cols = lengths[:, None] + torch.arange(q)  # [batch, q]
            mask = (torch.arange(width)[None, :] < lengths[:, None])[:, None, :].repeat(1, q, 1)
            mask.scatter_(2, block_cols[:, None, :].expand(batch, q, q), anc)  # [batch, q, width]
            if self.lean is not None:
                hidden, tapped = self.lean.forward(
                    cache,
                    tokens.to(self.device) if tokens is not None else None,
                    embeds.to(self.device) if embeds is not None else None,
                    positions.to(self.device),
                    mask.to(self.device),
                    taps,
                )
                return hidden, torch.cat(tapped, dim=-1) if taps else None
            full = self._mask(mask)
            attn: torch.Tensor | dict[str, torch.Tensor] = full
            if self.sliding_window is not None:
                kv_pos = torch.arange(width).repeat(batch, 1).scatter_(1, block_cols, positions)
                near = (positions[:, :, None] - kv_pos[:, None, :]) < self.sliding_window
                attn = {"full_attention": full, "sliding_attention": self._mask(mask & near)}
            tap = LayerTap(self.model, taps) if taps else None
            with tap.capture() if tap is not None else contextlib.nullcontext():
                out = self.backbone(
                    input_ids=tokens.to(self.device) if tokens is not None else None,
                    inputs_embeds=embeds.to(self.device) if embeds is not None else None,
                    attention_mask=attn,
                    position_ids=positions.to(self.device),
                    past_key_values=cache,
                    use_cache=True,
                )
            return out.last_hidden_state, tap.features() if tap is not None else None

    def small_ops(self, rows: int) -> contextlib.AbstractContextManager[None]:
        """On the row-invariant CPU kernels a small block's small ops run on one thread
        (``cpu_kernels.serial_small_ops``; the engine holds it for a whole decoding step)."""
        if self.fold_groups is None:
            return contextlib.nullcontext()
        return cpu_kernels.serial_small_ops(rows)

    def _mask(self, mask: torch.Tensor) -> torch.Tensor:
        """[batch, q, width] bool -> what the model's attention takes: [batch, 1, q, width] bool,
        or the row-invariant attention's folded bias."""
        mask = mask[:, None].to(self.device)
        if self.fold_groups is None:
            return mask
        return cpu_kernels.fold_mask(mask, self.fold_groups)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] float32 logits, with the model's soft-capping."""
        if self.head is None:
            raise RuntimeError("this model has no output embedding")
        with self.small_ops(hidden.numel() // hidden.shape[-1]):
            logits = self.head(hidden).float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
