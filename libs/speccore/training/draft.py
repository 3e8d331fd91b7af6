"""Training a distilled draft model: the target's first N layers learn to reproduce its
last hidden state (smooth-L1) and its next token (cross-entropy over the draft
vocabulary, weight 0.1), on the cached target features.

Held-out measurement: teacher-forced on the target's own replies, the draft's top-1
at each position is what it would draft there; a run of right guesses is exactly a
greedy chain's acceptance, so the mean of 1 + min(run, k) is the chain's mean
acceptance length with k draft tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from speccore.heads.distilled import DistilledLayers
from speccore.training.batching import draft_index, sequence_batches
from speccore.training.features import Sequences

CE_WEIGHT = 0.1
CHAIN_K = 5


class DraftObjective:
    def __init__(
        self,
        module: DistilledLayers,
        draft: PreTrainedModel,  # the target cut to ``module``'s layers (shares them)
        out_weight: torch.Tensor,  # [draft vocab, hidden]
        train: Sequences,
        heldout: Sequences,
        vocab_size: int,
        draft_ids: torch.Tensor,
        batch_tokens: int = 4096,
        device: torch.device | None = None,
    ) -> None:
        self.module = module
        self.device = device or torch.device("cpu")
        self.backbone = draft.base_model
        self.out_weight = out_weight.float()
        self.train_set, self.heldout = train, heldout
        self.index = draft_index(draft_ids, vocab_size)
        self.batch_tokens = batch_tokens

    def batches(self, gen: torch.Generator) -> list[Any]:
        return sequence_batches([len(ids) for ids in self.train_set.input_ids], self.batch_tokens, gen)

    def _run(
        self, data: Sequences, rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft hidden [N, T, h], target hidden [N, T, h], labels [N, T] (x_{t+1} or -100), valid [N, T]."""
        width = max(len(data.input_ids[i]) for i in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        target = torch.zeros(len(rows), width, data.hidden[rows[0]].shape[-1])
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        valid = torch.zeros(len(rows), width, dtype=torch.bool)
        for r, i in enumerate(rows):
            n = len(data.input_ids[i])
            ids[r, :n] = data.input_ids[i]
            attn[r, :n] = 1
            target[r, :n] = data.hidden[i].float()
            valid[r, : n - 1] = data.loss_mask[i][1:]
            labels[r, : n - 1] = torch.where(valid[r, : n - 1], self.index[data.input_ids[i][1:]], -100)
        ids, attn, target, labels, valid = (t.to(self.device) for t in (ids, attn, target, labels, valid))
        hidden = self.backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        return hidden, target, labels, valid

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        hidden, target, labels, valid = self._run(self.train_set, batch)
        n = int(valid.sum())
        if n == 0:
            return hidden.sum() * 0.0, 0
        reg = F.smooth_l1_loss(hidden[valid], target[valid])
        ok = labels >= 0
        ce = F.cross_entropy(F.linear(hidden[ok], self.out_weight), labels[ok]) if ok.any() else reg * 0.0
        return reg + CE_WEIGHT * ce, n

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not len(self.heldout):
            return {}
        runs: list[int] = []
        top1: list[bool] = []
        for i in range(len(self.heldout)):
            hidden, _, labels, valid = self._run(self.heldout, [i])
            correct = (F.linear(hidden[0], self.out_weight).argmax(-1) == labels[0]).tolist()
            for q in torch.nonzero(valid[0]).flatten().tolist():
                m = 0
                while m < CHAIN_K and q + m < len(correct) and correct[q + m]:
                    m += 1
                runs.append(m)
            top1.extend(correct[q] for q in torch.nonzero(valid[0]).flatten().tolist())
        return {
            f"chain_mean_acceptance_length_k{CHAIN_K}": 1.0 + sum(runs) / max(len(runs), 1),
            "top1": sum(top1) / max(len(top1), 1),
        }
