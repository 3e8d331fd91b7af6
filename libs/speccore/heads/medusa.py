"""Medusa heads (Cai et al. 2024, arXiv 2401.10774): K residual blocks on the target's
last hidden state; head k predicts the token k+1 places after the next one, through
the frozen target's own output embedding (restricted to the draft vocabulary).

What the Medusa versions mean in specops, where the target's weights never change:
- Medusa-1 (frozen backbone, heads trained on hard labels) is this module as is.
- Medusa-2 trains the backbone jointly with the heads; specops keeps the recipe's
  parts that leave the target alone: self-distilled data (the target's own replies,
  ``specops heads data --self-distill``), each head trained against the target's
  distribution for its token, and the heads' loss weighting. Joint
  backbone training is out of scope by design.
- "Medusa-2.1" and "Medusa-3" are product names, not published methods: in specops
  they are these heads trained by T3 on self-distilled data and decoded with a
  candidate tree (``speccore.heads.trees``), losslessly verified. Medusa-2's lossy
  typical acceptance is not offered.
"""

from __future__ import annotations

import torch
from torch import nn

from speccore.heads.artifact import HeadConfig


class ResBlock(nn.Module):
    """x + SiLU(W x); W starts at zero so an untrained head repeats the target's prediction."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_res_layers)))
            for _ in range(config.num_heads)
        )
        self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size, dtype=torch.long))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] target features -> [..., K, hidden] one feature per head."""
        return torch.stack([head(hidden) for head in self.heads], dim=-2)
