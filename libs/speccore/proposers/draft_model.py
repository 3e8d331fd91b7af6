"""A smaller causal LM with the target's tokenizer drafts k tokens autoregressively.

The draft keeps its own position-indexed cache in step with the sequence: after
each verify step it rolls back to the longest prefix it has already seen and
feeds only the tokens it has not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from speccore.errors import SpecError
from speccore.heads.distilled import DistilledLayers, draft_with, is_distilled, load_distilled
from speccore.kv_cache import StaticKVCache
from speccore.models import LoadedModel, load_model
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, capped
from speccore.runner import ModelRunner, pad_rows
from speccore.sampling import probs_from_logits, sample
from speccore.state import Sequence
from speccore.tree import chain_parents

SELF_PREFIX = "self:"


def truncated_copy(model: PreTrainedModel, n_layers: int) -> PreTrainedModel:
    """The target's first n_layers with its final norm and head; weights shared, not copied."""
    total = model.config.num_hidden_layers
    if not 1 <= n_layers < total:
        raise SpecError(f"self:{n_layers} needs 1 <= layers < {total} (the target's depth)")
    source: Any = model.base_model
    return draft_with(model, DistilledLayers(nn.ModuleList(list(source.layers)[:n_layers]), source.norm))


def resolve_draft(ref: str | None, target: LoadedModel) -> tuple[PreTrainedModel, int]:
    """The draft module and the bytes of weights it adds beyond the target."""
    if not ref:
        raise SpecError(
            "the draft_model family needs --draft MODEL (self:N for the target's first N layers, "
            "or a directory written by `specops heads train --family draft`)"
        )
    if ref.startswith(SELF_PREFIX):
        try:
            n_layers = int(ref[len(SELF_PREFIX) :])
        except ValueError:
            raise SpecError(f"bad draft '{ref}': expected self:N with N a number of layers") from None
        return truncated_copy(target.model, n_layers), 0
    if is_distilled(Path(ref)):
        return load_distilled(target, Path(ref))
    draft = load_model(ref, device=str(target.device), dtype=str(target.dtype).removeprefix("torch."))
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise SpecError(f"draft '{ref}' has a different tokenizer than the target; drafts must share it")
    return draft.model, draft.weight_bytes


class DraftModelProposer(Proposer):
    family = "draft_model"
    adapts_draft = True
    row_state = ("cache",)

    def __init__(self, cfg: ProposerConfig, target: LoadedModel) -> None:
        self.k = cfg.k
        model, self.weight_bytes = resolve_draft(cfg.draft, target)
        self.runner = ModelRunner(model)
        self.cache: StaticKVCache | None = None

    @property
    def draft_nodes(self) -> int:
        return self.k

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        capacity = max(len(s.prompt_ids) + s.max_new_tokens for s in seqs) + 2 * self.k + 8
        self.cache = self.runner.new_cache(len(seqs), capacity)

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        cache = self.cache
        # Each row drafts its own budget: a row draws from its generator only for its own
        # drafts, so its sampled tokens do not depend on the rows beside it.
        k = capped(self.k, ctx)
        budgets = [0 if s.finished else max(min(k, s.remaining - 1), 0) for s in seqs]
        steps = max(budgets, default=0)
        if cache is None or steps <= 0:
            return DraftTree.empty(len(seqs))
        # Catch up on every token the draft has not seen, pending token included.
        seen = cache.lengths.tolist()
        backlog = [s.token_ids[n:] if not s.finished else [] for s, n in zip(seqs, seen, strict=True)]
        tokens, counts = pad_rows(backlog)
        hidden = self.runner.forward(cache, tokens)
        cache.commit(counts)
        last = hidden[torch.arange(len(seqs)), (counts - 1).clamp(min=0).to(hidden.device)]

        drafts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for step in range(steps):
            logits = self.runner.logits(last).cpu()  # [batch, vocab]
            if ctx.sampling.greedy:
                token = logits.argmax(-1)
            else:
                q = probs_from_logits(logits, ctx.sampling)
                token = torch.tensor(
                    [sample(q[r], g) if step < budgets[r] else 0 for r, g in enumerate(ctx.generators)]
                )
                probs.append(q)
            drafts.append(token)
            if step + 1 < steps:
                last = self.runner.forward(cache, token[:, None])[:, 0]
                cache.commit(torch.ones(len(seqs), dtype=torch.long))
        return DraftTree(
            tokens=torch.stack(drafts, 1),
            parents=chain_parents(len(seqs), steps),
            acceptable=torch.tensor([[i < budget for i in range(steps)] for budget in budgets]),
            draft_probs=torch.stack(probs, 1) if probs else None,
        )

    def observe(self, seqs: list[Sequence], outcome: object) -> None:
        if self.cache is None:
            return
        # Keep what the draft saw that the sequence still holds (the new pending token is new).
        keep = torch.tensor([len(s.token_ids) - 1 for s in seqs])
        self.cache.lengths = torch.minimum(self.cache.lengths, keep)

    def extra_memory_bytes(self) -> int:
        return self.weight_bytes + (self.cache.nbytes() if self.cache is not None else 0)


def make_draft_model(cfg: ProposerConfig, target: LoadedModel) -> Proposer:
    return DraftModelProposer(cfg, target)
