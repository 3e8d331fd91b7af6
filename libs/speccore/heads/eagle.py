"""EAGLE heads: one decoder layer that extrapolates the target's features.

- EAGLE-1 (Li et al. 2024, arXiv 2401.15077): the layer reads [token embedding;
  feature] where the feature is the target's last hidden state (the input of its
  output embedding) at the previous position, and predicts the next feature; the
  target's output embedding turns it into draft logits.
- EAGLE-2 (arXiv 2406.16858) is a decoding change only: a dynamic tree grown by
  draft confidence (``speccore.proposers.eagle``).
- EAGLE-3 (arXiv 2503.01840): the feature fuses low, middle and high layers of the
  target (``feature_layers``, fused by ``fuse``), the head has its own output layer
  over a reduced draft vocabulary, and training unrolls the head on its own outputs
  (training-time test, ``speccore.training.eagle``). Its layer is the one vLLM and
  the speculators format use: attention reads [norm(embedding); norm(feature)]
  (2 x hidden), the residual stream starts at the feature, and the feature handed to
  the next draft step is the layer's output before the final norm — so a trained
  head exports as a speculators checkpoint (``speccore.heads.speculators``).

The layer is a Llama decoder layer whatever the target's architecture; it keeps its
own key/value cache at the target's positions, so it runs through the same
``ModelRunner`` (tree masks, commit and rollback) as any model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from speccore.heads.artifact import HeadConfig


def layer_config(config: HeadConfig) -> LlamaConfig:
    llama = LlamaConfig(
        vocab_size=1,  # inputs arrive as embeddings: the layer owns no token table
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    llama._attn_implementation = "sdpa"
    return llama


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """A decoder layer whose input is [embedding; feature] (2 x hidden): attention reads
    both, normed apart; the residual stream starts at the feature."""

    def __init__(self, config: LlamaConfig, layer_idx: int = 0) -> None:
        super().__init__(config, layer_idx)
        h, attn = config.hidden_size, self.self_attn
        bias = config.attention_bias
        attn.q_proj = nn.Linear(2 * h, attn.q_proj.out_features, bias=bias)
        attn.k_proj = nn.Linear(2 * h, attn.k_proj.out_features, bias=bias)
        attn.v_proj = nn.Linear(2 * h, attn.v_proj.out_features, bias=bias)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        embeds, feature = hidden_states.chunk(2, dim=-1)
        normed = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)
        attn_out, _ = self.self_attn(normed, *args, **kwargs)
        hidden = feature + attn_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.eagle3 = config.family == "eagle3"
        self.layer = LlamaModel(layer_config(config))
        if self.eagle3:
            # fuse: the tapped target layers -> one feature; the layer reads [embedding; feature].
            self.fuse: nn.Linear | None = nn.Linear(len(config.feature_layers) * h, h, bias=False)
            self.fc: nn.Linear | None = None
            self.layer.layers[0] = Eagle3DecoderLayer(self.layer.config)
            # The output before the norm feeds the next step; the norm only precedes the logits.
            self.norm: nn.Module = self.layer.norm
            self.layer.norm = nn.Identity()  # type: ignore[assignment]  # norm moved to self.norm
            self.lm_head: nn.Linear | None = nn.Linear(h, config.draft_vocab_size, bias=False)
        else:
            self.fuse, self.lm_head = None, None
            self.fc = nn.Linear(2 * h, h, bias=False)  # EAGLE-1: [embedding; feature] -> hidden
            self.norm = nn.Identity()  # the layer's own final norm already ran
        self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size, dtype=torch.long))

    def target_feature(self, feature: torch.Tensor) -> torch.Tensor:
        """A feature taken from the target ([..., taps*hidden] for EAGLE-3) -> [..., hidden]."""
        return self.fuse(feature) if self.fuse is not None else feature

    def inputs(self, token_embeds: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """The layer's input at a position from a token embedding and a feature."""
        pair = torch.cat([token_embeds, feature], dim=-1)
        return self.fc(pair) if self.fc is not None else pair

    def draft_logits(self, out: torch.Tensor, out_weight: torch.Tensor | None) -> torch.Tensor:
        """[..., draft vocab] logits of layer outputs; EAGLE-1 scores with ``out_weight``
        (the target's output rows of the draft vocabulary), EAGLE-3 with its own head."""
        if self.lm_head is not None:
            return self.lm_head(self.norm(out))
        if out_weight is None:
            raise ValueError("an EAGLE-1 head scores tokens with the target's output rows")
        return torch.nn.functional.linear(out, out_weight)
