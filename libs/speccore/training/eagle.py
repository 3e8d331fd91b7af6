"""Training EAGLE heads, and measuring them on held-out sequences.

Entry j of the head (position j) reads [embedding of x_{j+1}; feature at j] and its
output predicts the feature at j+1, whose logits give x_{j+2}.

- ``eagle`` (EAGLE-1): the feature is the target's last hidden state; the loss is
  smooth-L1 on the predicted feature plus 0.1 x cross-entropy on its logits (through
  the target's output embedding over the draft vocabulary), with a little uniform
  noise on the input features so the head tolerates its own errors.
- ``eagle3``: the feature fuses the tapped target layers; cross-entropy only, through
  the head's own output layer; and a training-time test: the head is unrolled for
  ``steps`` steps, step s reading its own step s-1 output as the feature, with the
  attention each entry would have at decoding time (target-fed entries up to p-s,
  then its own chain) — see :func:`unroll`.

:func:`unroll` is also how a head is measured: teacher-forced on held-out replies of
the target, step s at position j is exactly the s+1-th token of a greedy chain
drafted from entry j-s, so the run of correct steps is the chain's acceptance.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from speccore.heads.eagle import EagleHead
from speccore.training.batching import draft_index, sequence_batches
from speccore.training.features import Sequences

STEP_DECAY = 0.8
FEATURE_NOISE = 0.05  # EAGLE-1: uniform noise, relative to each feature's scale
CE_WEIGHT = 0.1  # EAGLE-1's weight of the token loss beside the feature loss


def unroll_mask(length: int, steps: int) -> torch.Tensor:
    """[steps*L, steps*L] bool: who entry (s, p) attends to.

    Step 0 is the ordinary causal layer over target-fed entries. Entry (s, p), s >= 1,
    stands for the s-th draft after target entry p-s: it sees target entries up to
    p-s and the chain (i, p-s+i) for i = 1..s — itself included.
    """
    q = torch.arange(steps * length)
    s, p = q // length, q % length
    ks, kp = s[None, :], p[None, :]
    qs, qp = s[:, None], p[:, None]
    target_fed = (ks == 0) & (kp <= qp - qs)
    chain = (ks >= 1) & (ks <= qs) & (kp == qp - qs + ks)
    return target_fed | chain


def unroll(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor, steps: int) -> torch.Tensor:
    """Outputs [steps, L, hidden] of the head unrolled on one sequence.

    embeds: [L, hidden] embeddings of x_1..x_L; features: [L, F] target features at
    0..L-1. Step s >= 1 feeds entry p the step s-1 output at p-1 (entries p < s have no
    chain behind them: their outputs are meaningless and never used).
    """
    length = embeds.shape[0]
    fed = [head.inputs(embeds, head.target_feature(features))]
    outputs = torch.empty(0)
    for s in range(1, steps + 1):
        mask = unroll_mask(length, s).to(embeds.device)[None, None]
        pos = torch.arange(length, device=embeds.device).repeat(s)[None]
        outputs = head.layer(
            inputs_embeds=torch.cat(fed)[None], attention_mask=mask, position_ids=pos
        ).last_hidden_state[0]
        outputs = outputs.view(s, length, -1)
        if s < steps:
            prev = torch.cat([outputs[s - 1, :1], outputs[s - 1, :-1]])  # output at p-1
            fed.append(head.inputs(embeds, prev))
    return outputs


class EagleObjective:
    def __init__(
        self,
        module: EagleHead,
        embedding: nn.Module,  # the target's input embedding, frozen
        out_weight: torch.Tensor | None,  # [draft vocab, hidden] target rows (eagle); None: head.lm_head
        train: Sequences,
        heldout: Sequences,
        vocab_size: int,
        *,
        train_steps: int = 1,
        eval_steps: int = 5,
        batch_tokens: int = 4096,
        device: torch.device | None = None,
    ) -> None:
        self.module = module
        self.device = device or torch.device("cpu")
        self.embedding = embedding
        self.out_weight = out_weight.float() if out_weight is not None else None
        self.train_set, self.heldout = train, heldout
        self.index = draft_index(module.get_buffer("draft_ids"), vocab_size)
        self.train_steps, self.eval_steps = train_steps, eval_steps
        self.batch_tokens = batch_tokens
        self.eagle3 = module.config.family == "eagle3"

    def batches(self, gen: torch.Generator) -> list[Any]:
        lengths = [len(ids) for ids in self.train_set.input_ids]
        return sequence_batches(lengths, self.batch_tokens, gen)

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.module.draft_logits(out, self.out_weight)

    def _inputs(
        self, data: Sequences, i: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """embeds [L, h] of x_1.., features [L, F] at 0.., labels [L] (x_{j+2} in draft ids or
        -100), target next features [L, h] (f_{j+1}); L = T-1."""
        ids, mask = data.input_ids[i], data.loss_mask[i]
        feats = (data.taps[i] if self.eagle3 and data.taps is not None else data.hidden[i]).to(self.device)
        with torch.no_grad():
            embeds = self.embedding(ids[1:].to(self.device)).float()
        labels = torch.full((len(ids) - 1,), -100, dtype=torch.long)
        keep = mask[2:]
        labels[:-1] = torch.where(keep, self.index[ids[2:]], -100)
        next_feats = data.hidden[i][1:].to(self.device).float()
        return embeds, feats[:-1].float(), labels.to(self.device), next_feats

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        total = torch.zeros((), device=self.device)
        tokens = 0
        for i in batch:
            embeds, feats, labels, next_feats = self._inputs(self.train_set, i)
            valid = labels >= 0
            if not valid.any():
                continue
            if not self.eagle3:
                scale = feats.abs().mean(-1, keepdim=True)
                # drawn on the CPU: the same noise, so the same run, on any device
                uniform = torch.rand(feats.shape, generator=gen).to(self.device)
                feats = feats + (uniform - 0.5) * 2 * FEATURE_NOISE * scale
            outs = unroll(self.module, embeds, feats, self.train_steps)
            n = int(valid.sum())
            for s in range(self.train_steps):
                ok = valid.clone()
                ok[:s] = False
                if not ok.any():
                    continue
                ce = F.cross_entropy(self._logits(outs[s][ok]), labels[ok], reduction="sum") / n
                if self.eagle3:
                    total = total + STEP_DECAY**s * ce
                else:
                    reg = F.smooth_l1_loss(outs[s][ok], next_feats[ok], reduction="sum") / (
                        n * outs.shape[-1]
                    )
                    total = total + STEP_DECAY**s * (reg + CE_WEIGHT * ce)
            tokens += n
        return total / max(len(batch), 1), tokens

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not len(self.heldout):
            return {}
        steps = self.eval_steps
        runs, top1 = [], []
        for i in range(len(self.heldout)):
            embeds, feats, labels, _ = self._inputs(self.heldout, i)
            outs = unroll(self.module, embeds, feats, steps)
            correct = self._logits(outs).argmax(-1) == labels[None]  # [steps, L]
            runs.append(chain_runs(correct)[labels >= 0])
            top1.append(correct[0][labels >= 0].float())
        run = torch.cat(runs).float()
        return {
            "chain_mean_acceptance_length": 1.0 + (float(run.mean()) if len(run) else 0.0),
            "step1_top1": float(torch.cat(top1).mean()) if top1 else 0.0,
            "chain_depth": steps,
        }


def chain_runs(correct: torch.Tensor) -> torch.Tensor:
    """[L] draft tokens a greedy chain drafted from entry q gets accepted, from ``correct``
    [steps, L] (step m at position q + m right): the run of m = 0, 1, ... with
    ``correct[m, q + m]``; a chain stops at the sequence's end."""
    steps, length = correct.shape
    diagonal = torch.zeros_like(correct)
    for m in range(steps):
        diagonal[m, : length - m] = correct[m, m:]
    return torch.cumprod(diagonal.long(), dim=0).sum(0)
