"""A lean forward pass for Llama-family decoders on speccore's native CPU kernels.

At batch 1 on a CPU, a decoding step of a small model is dominated by everything but its
weights: Hugging Face's module plumbing (module calls, keyword arguments, per-layer mask
and cache dispatch) and the few dozen torch ops a layer runs, a few microseconds each.
This runs the same arithmetic as one native call a layer (``speccore.native_kernels``'
``decoder_layer``: the fused q/k/v projection (``cpu_kernels.PackedGroup``); rotary
embedding, the cache write and masked attention in one kernel; the output projection; the
residual add fused with the next RMSNorm; the fused gate/up projection; the SiLU-gated
product; the down projection; the residual add fused with the next layer's RMSNorm). Every
kernel computes each row on its own in one fixed order, so a block's rows get the bits of
decoding its tokens one at a time. The results equal the Hugging Face modules' within float
rounding (sums run in another order; a test compares them); a model runs one path or the
other throughout.

Layers that are not plain Llama-style layers (Gemma's extra norms and scaled embeddings,
sliding windows, EAGLE-3's two-part input), and hosts where the native kernels do not
build, keep the Hugging Face path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer, MistralRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

from speccore import cpu_kernels, native_kernels
from speccore.kv_cache import StaticKVCache

# Decoder layers whose forward is exactly: x + attn(norm(x)); x + down(silu(gate) * up)(norm(x)).
LAYERS = (LlamaDecoderLayer, MistralDecoderLayer, Qwen2DecoderLayer)
NORMS = (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm)


@dataclass(slots=True)
class _Layer:
    attn_norm: nn.Module  # RMSNorm (weight, variance_epsilon)
    qkv: cpu_kernels.PackedGroup
    o_proj: cpu_kernels.PackedLinear
    mlp_norm: nn.Module
    gate_up: cpu_kernels.PackedGroup
    down_proj: cpu_kernels.PackedLinear


class LeanDecoder:
    """Runs a supported backbone over a block; see ``build``."""

    def __init__(self, backbone: Any, layers: list[_Layer]) -> None:
        attn = backbone.layers[0].self_attn
        self.backbone = backbone
        self.layers = layers
        self.heads = int(attn.config.num_attention_heads)
        self.kv_heads = int(attn.config.num_key_value_heads)
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.native: Any = native_kernels.load()
        # Per layer, what its native call takes besides the block: the packed weights, their
        # output sizes and biases, then the norm after attention and the one after the MLP
        # (the next layer's input norm, or the final norm) with their epsilons.
        self.calls: list[tuple[Any, ...]] = []
        for index, layer in enumerate(layers):
            after = layers[index + 1].attn_norm if index + 1 < len(layers) else backbone.norm
            matmuls = (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)
            self.calls.append(
                (
                    [m.packed for m in matmuls],
                    [m.out_features for m in matmuls],
                    [m.bias for m in matmuls],
                    *self._norm(layer.mlp_norm),
                    *self._norm(after),
                )
            )

    @classmethod
    def build(cls, model: nn.Module) -> LeanDecoder | None:
        """A lean decoder for ``model``'s backbone, or None where it does not apply: not
        on the row-invariant CPU kernels, no native kernels on this host, sliding-window
        attention, or a layer that is not a plain Llama-family layer with fused projections."""
        config: Any = getattr(model, "config", None)
        if config is None or config._attn_implementation != cpu_kernels.ATTENTION_NAME:
            return None
        if native_kernels.load() is None:
            return None
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return None
        backbone: Any = getattr(model, "base_model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if backbone is None or not all(hasattr(backbone, name) for name in needed):
            return None
        if type(backbone.embed_tokens) is not nn.Embedding or type(backbone.norm) not in NORMS:
            return None
        layers = [_lean_layer(layer) for layer in backbone.layers]
        if not layers or any(layer is None for layer in layers):
            return None
        return cls(backbone, [layer for layer in layers if layer is not None])

    def forward(
        self,
        cache: StaticKVCache,
        tokens: torch.Tensor | None,  # [batch, q]
        embeds: torch.Tensor | None,  # [batch, q, hidden], instead of tokens
        positions: torch.Tensor,  # [batch, q]
        mask: torch.Tensor,  # [batch, q, width] bool, True = attend
        taps: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states after the final norm [batch, q, hidden], and the outputs of the
        decoder layers in ``taps`` ([batch, q, hidden] each, in the order asked)."""
        x = self.backbone.embed_tokens(tokens) if embeds is None else embeds
        batch, q, hidden = x.shape
        # [batch, q, head_dim] each
        cos, sin = (part.contiguous() for part in self.backbone.rotary_emb(x, positions))
        x = x.reshape(batch * q, hidden).clone()  # the residual stream, added to in place
        mask = mask.contiguous()
        lengths = cache.lengths.to(self.backbone.embed_tokens.weight.device)
        native = self.native
        normed = native.rms_norm(x, *self._norm(self.layers[0].attn_norm))
        threads = cpu_kernels.matmul_threads()
        tapped: dict[int, torch.Tensor] = {}
        for index, call in enumerate(self.calls):
            keys, values = cache.buffers(index, self.kv_heads, self.head_dim)
            normed = native.decoder_layer(
                x, normed, *call, cos, sin, keys, values, lengths, mask,
                self.heads, self.kv_heads, self.scaling, threads,
            )  # fmt: skip
            if index in taps:
                tapped[index] = x.view(batch, q, hidden).clone()
        return normed.view(batch, q, hidden), [tapped[i] for i in taps]

    @staticmethod
    def _norm(norm: Any) -> tuple[torch.Tensor, float]:
        return norm.weight, float(norm.variance_epsilon)


def _lean_layer(layer: nn.Module) -> _Layer | None:
    attn: Any = getattr(layer, "self_attn", None)
    mlp: Any = getattr(layer, "mlp", None)
    if type(layer) not in LAYERS or attn is None or mlp is None:
        return None
    qkv = _group_of(attn.q_proj, attn.k_proj, attn.v_proj)
    gate_up = _group_of(mlp.gate_proj, mlp.up_proj)
    norms: tuple[Any, Any] = (layer.input_layernorm, layer.post_attention_layernorm)
    if qkv is None or gate_up is None or any(type(n) not in NORMS for n in norms):
        return None
    if not isinstance(attn.o_proj, cpu_kernels.PackedLinear) or not isinstance(
        mlp.down_proj, cpu_kernels.PackedLinear
    ):
        return None
    if type(mlp.act_fn) not in (SiLUActivation, nn.SiLU):
        return None
    if any(m.packed.dim() != 4 for m in (qkv, attn.o_proj, gate_up, mlp.down_proj)):
        return None  # a weight the native kernels do not take (oneDNN's layout)
    return _Layer(norms[0], qkv, attn.o_proj, norms[1], gate_up, mlp.down_proj)


def _group_of(*parts: nn.Module) -> cpu_kernels.PackedGroup | None:
    """The PackedGroup whose members are ``parts``, in this order, if there is one."""
    if not all(isinstance(p, cpu_kernels.PackedPart) for p in parts):
        return None
    group = parts[0].__dict__["group"]
    same = all(p.__dict__["group"] is group and p.index == i for i, p in enumerate(parts))  # type: ignore[union-attr]
    return group if same and len(group.sizes) == len(parts) else None
