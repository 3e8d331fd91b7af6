"""EAGLE heads: one decoder layer that extrapolates the target's features.

- EAGLE-1 (Li et al. 2024, arXiv 2401.15077): the layer reads [token embedding;
  feature] where the feature is the target's last hidden state (the input of its
  output embedding) at the previous position, and predicts the next feature; the
  target's output embedding turns it into draft logits.
- EAGLE-2 (arXiv 2406.16858) is a decoding change only: a dynamic tree grown by
  draft confidence (``speccore.proposers.eagle``).
- EAGLE-3 (arXiv 2503.01840): the feature fuses low, middle and high layers of the
  target (``feature_layers``), the head has its own output layer over a reduced
  draft vocabulary, and training unrolls the head on its own outputs
  (training-time test, ``speccore.training.eagle``).

The layer is a Llama decoder layer whatever the target's architecture; it keeps its
own key/value cache at the target's positions, so it runs through the same
``ModelRunner`` (tree masks, commit and rollback) as any model.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel

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


class EagleHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        n_taps = len(config.feature_layers)
        # EAGLE-3 fuses the tapped target layers into one feature; EAGLE-1 reads the last hidden state.
        self.fuse = nn.Linear(n_taps * h, h, bias=False) if n_taps else None
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layer = LlamaModel(layer_config(config))
        self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size, dtype=torch.long))
        # EAGLE-3 trains its own output layer over the draft vocabulary.
        eagle3 = config.family == "eagle3"
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False) if eagle3 else None

    def target_feature(self, feature: torch.Tensor) -> torch.Tensor:
        """A feature taken from the target ([..., taps*hidden] for EAGLE-3) -> [..., hidden]."""
        return self.fuse(feature) if self.fuse is not None else feature

    def inputs(self, token_embeds: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """The layer's input at a position: [token embedding; feature] -> [..., hidden]."""
        return self.fc(torch.cat([token_embeds, feature], dim=-1))
