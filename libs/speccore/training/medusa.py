"""Training Medusa heads: head k at position t learns the token at t+1+k.

The loss is the Medusa-1 loss, cross-entropy per head weighted 0.8^k, over the
draft vocabulary through the frozen target's output embedding. Held-out
measurement: for each position where the target emits a completion token, how
many heads in a row predict their token (top-1), plus one for the target's own
token: the mean acceptance length of a chain draft, teacher-forced on the
held-out replies (exact for greedy decoding when those replies are the target's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from speccore.heads.medusa import MedusaHeads
from speccore.training.batching import draft_index, sequence_batches
from speccore.training.features import Sequences

HEAD_DECAY = 0.8


class MedusaObjective:
    def __init__(
        self,
        module: MedusaHeads,
        out_weight: torch.Tensor,  # [draft vocab, hidden] target output embedding rows, frozen
        train: Sequences,
        heldout: Sequences,
        vocab_size: int,
        batch_tokens: int = 4096,
    ) -> None:
        self.module = module
        self.out_weight = out_weight.float()
        self.train_set, self.heldout = train, heldout
        self.index = draft_index(module.get_buffer("draft_ids"), vocab_size)
        self.batch_tokens = batch_tokens
        self.k = module.config.num_heads

    def batches(self, gen: torch.Generator) -> list[Any]:
        lengths = [len(ids) for ids in self.train_set.input_ids]
        return sequence_batches(lengths, self.batch_tokens, gen)

    def _positions(self, data: Sequences, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Features [N, hidden] at positions whose next token is a completion token, and
        labels [N, K]: the token 2..K+1 places later, -100 where absent or not in the loss."""
        feats, labels = [], []
        for i in rows:
            ids, mask, hidden = data.input_ids[i], data.loss_mask[i], data.hidden[i]
            t_len = len(ids)
            pos = torch.nonzero(mask[1:]).flatten()  # t where x_{t+1} is a completion token
            lab = torch.full((len(pos), self.k), -100, dtype=torch.long)
            for k in range(1, self.k + 1):
                j = pos + 1 + k
                ok = j < t_len
                jj = j.clamp(max=t_len - 1)
                lab[:, k - 1] = torch.where(ok & mask[jj], self.index[ids[jj]], -100)
            feats.append(hidden[pos].float())
            labels.append(lab)
        return torch.cat(feats), torch.cat(labels)

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        return F.linear(self.module(feats), self.out_weight)  # [N, K, draft vocab]

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        feats, labels = self._positions(self.train_set, batch)
        logits = self._logits(feats)
        total = feats.new_zeros(())
        weight = 0.0
        for k in range(self.k):
            if (labels[:, k] >= 0).any():
                total = total + HEAD_DECAY**k * F.cross_entropy(logits[:, k], labels[:, k], ignore_index=-100)
                weight += HEAD_DECAY**k
        return total / max(weight, 1e-9), int((labels[:, 0] >= 0).sum())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not len(self.heldout):
            return {}
        feats, labels = self._positions(self.heldout, list(range(len(self.heldout))))
        correct = self._logits(feats).argmax(-1) == labels  # [N, K]; -100 never matches
        run = torch.cumprod(correct.long(), dim=1).sum(1)  # heads in a row that are right
        out = {"chain_mean_acceptance_length": 1.0 + float(run.float().mean())}
        for k in range(self.k):
            out[f"head{k + 1}_top1"] = float(correct[:, k].float().mean())
        return out
