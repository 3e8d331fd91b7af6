"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of
the sequence's last n tokens (n from ngram_max down to ngram_min).

With a cross-request pool (speccore.draft_pool, ``Engine(draft_pools=...)``) a row whose
request names a scope also asks its scope's pool, and drafts from it when the pool matches a
longer suffix than the row's own tokens do.

Each sequence keeps an index from every n-gram it holds to where the latest
occurrence ends, brought up to date with the tokens added since the last step, so a
lookup costs a few dictionary probes whatever the length of the sequence.
"""

from __future__ import annotations

import torch

from speccore.draft_pool import DraftPool
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, capped, knob_values
from speccore.state import Sequence


class NgramIndex:
    """n-grams (ngram_min <= n <= ngram_max) of a growing token list -> the position just
    after their latest occurrence that has a token after it."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.sizes = range(ngram_min, ngram_max + 1)
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in the index

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens after the latest earlier occurrence of the longest suffix n-gram."""
        return self.match(tokens, k)[1]

    def match(self, tokens: list[int], k: int) -> tuple[int, list[int]]:
        """(the longest suffix n-gram's length, the k tokens after its latest earlier occurrence);
        (0, []) when no suffix n-gram occurred before."""
        last = len(tokens) - 1  # only n-grams that end before the last token have a successor
        for end in range(self.indexed, last):
            for n in self.sizes:
                if end + 1 >= n:
                    self.after[tuple(tokens[end + 1 - n : end + 1])] = end + 1
        self.indexed = max(self.indexed, last)
        for n in reversed(self.sizes):
            start = self.after.get(tuple(tokens[len(tokens) - n :])) if n <= last else None
            if start is not None:
                return n, tokens[start : start + k]
        return 0, []


def lookup(tokens: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Tokens following the most recent earlier match of the longest suffix n-gram."""
    return NgramIndex(ngram_min, ngram_max).lookup(tokens, k)


class NgramProposer(Proposer):
    family = "ngram"
    adapts_draft = True
    reads_draft_pools = True
    row_state = ("indexes",)

    def __init__(self, cfg: ProposerConfig) -> None:
        knobs = knob_values(self.family, cfg)
        self.k = cfg.k
        self.ngram_min = int(knobs["ngram_min"])
        self.ngram_max = int(knobs["ngram_max"])
        self.indexes: list[NgramIndex] = []

    @property
    def draft_nodes(self) -> int:
        return self.k

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        self.indexes = [NgramIndex(self.ngram_min, self.ngram_max) for _ in seqs]

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        chains: list[list[int]] = []
        k = capped(self.k, ctx)
        for seq, index in zip(seqs, self.indexes, strict=True):
            budget = min(k, seq.remaining - 1)
            chains.append(self._draft(seq, index, budget) if not seq.finished and budget > 0 else [])
        return DraftTree.from_chains(chains)

    def _draft(self, seq: Sequence, index: NgramIndex, budget: int) -> list[int]:
        """The row's own match, or its scope's pool's where that matches a longer suffix."""
        tokens = seq.token_ids
        length, own = index.match(tokens, budget)
        if self.draft_pools is None or seq.draft_scope is None:
            return own
        pooled = self.draft_pools.pool(seq.draft_scope).lookup(tokens, budget)
        self.draft_pools.record(seq.draft_scope, len(pooled.tokens) if pooled is not None else None)
        return pooled.tokens if pooled is not None and pooled.length > length else own

    def new_draft_pool(self) -> DraftPool:
        return DraftPool()


def make_ngram(cfg: ProposerConfig, target: object) -> Proposer:
    return NgramProposer(cfg)
