"""Training Medusa heads: head k at position t learns the token at t+1+k.

The loss is Medusa's per-head cross-entropy weighted 0.8^k, over the draft
vocabulary through the frozen target's output embedding, taken against the
target's own distribution for each head's token (Medusa-2's self-distillation;
the target's features at those positions are already cached) rather than
against the one token in the data. Held-out
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
EVAL_SEQUENCES = 32  # held-out sequences scored at once


class MedusaObjective:
    def __init__(
        self,
        module: MedusaHeads,
        out_weight: torch.Tensor,  # [draft vocab, hidden] target output embedding rows, frozen
        train: Sequences,
        heldout: Sequences,
        vocab_size: int,
        batch_tokens: int = 4096,
        device: torch.device | None = None,
    ) -> None:
        self.module = module
        self.device = device or torch.device("cpu")
        self.out_weight = out_weight.float()
        self.train_set, self.heldout = train, heldout
        self.index = draft_index(module.get_buffer("draft_ids"), vocab_size)
        self.batch_tokens = batch_tokens
        self.k = module.config.num_heads

    def batches(self, gen: torch.Generator) -> list[Any]:
        lengths = [len(ids) for ids in self.train_set.input_ids]
        return sequence_batches(lengths, self.batch_tokens, gen)

    def _positions(
        self, data: Sequences, rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """At positions t whose next token is a completion token: features [N, hidden];
        labels [N, K], the token 2..K+1 places later (-100 where absent, out of the loss or
        out of the draft vocabulary); the target's features that predicted those tokens
        [N, K, hidden]; and where a head has a token to learn at all [N, K]."""
        feats, labels, teachers, valid = [], [], [], []
        for i in rows:
            ids, mask, hidden = data.input_ids[i], data.loss_mask[i], data.hidden[i]
            t_len = len(ids)
            pos = torch.nonzero(mask[1:]).flatten()  # t where x_{t+1} is a completion token
            lab = torch.full((len(pos), self.k), -100, dtype=torch.long)
            ok_k = torch.zeros(len(pos), self.k, dtype=torch.bool)
            teach = torch.zeros(len(pos), self.k, hidden.shape[-1])
            for k in range(1, self.k + 1):
                j = pos + 1 + k
                jj = j.clamp(max=t_len - 1)
                ok = (j < t_len) & mask[jj]
                lab[:, k - 1] = torch.where(ok, self.index[ids[jj]], -100)
                ok_k[:, k - 1] = ok
                teach[:, k - 1] = hidden[jj - 1].float()
            feats.append(hidden[pos].float())
            labels.append(lab)
            teachers.append(teach)
            valid.append(ok_k)
        return (
            torch.cat(feats).to(self.device),
            torch.cat(labels).to(self.device),
            torch.cat(teachers).to(self.device),
            torch.cat(valid).to(self.device),
        )

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        return F.linear(self.module(feats), self.out_weight)  # [N, K, draft vocab]

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        """Self-distillation: each head matches the target's own distribution for its
        token (over the draft vocabulary), weighted 0.8^k."""
        feats, labels, teachers, valid = self._positions(self.train_set, batch)
        logp = self._logits(feats).log_softmax(-1)
        with torch.no_grad():
            p_target = F.linear(teachers, self.out_weight).softmax(-1)
        per_row = -(p_target * logp).sum(-1)  # [N, K] cross-entropy against the target
        total = feats.new_zeros(())
        weight = 0.0
        for k in range(self.k):
            if valid[:, k].any():
                total = total + HEAD_DECAY**k * per_row[valid[:, k], k].mean()
                weight += HEAD_DECAY**k
        return total / max(weight, 1e-9), int(valid[:, 0].sum())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not len(self.heldout):
            return {}
        n, parts = len(self.heldout), []
        for start in range(0, n, EVAL_SEQUENCES):  # N x K x draft vocab logits: a slice at a time
            feats, labels, _, _ = self._positions(
                self.heldout, list(range(start, min(start + EVAL_SEQUENCES, n)))
            )
            parts.append(self._logits(feats).argmax(-1) == labels)  # -100 never matches
        correct = torch.cat(parts)  # [N, K]
        run = torch.cumprod(correct.long(), dim=1).sum(1)  # heads in a row that are right
        out = {"chain_mean_acceptance_length": 1.0 + float(run.float().mean()), "chain_depth": self.k}
        for k in range(self.k):
            out[f"head{k + 1}_top1"] = float(correct[:, k].float().mean())
        return out
