"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of
the sequence's last n tokens (n from ngram_max down to ngram_min)."""

from __future__ import annotations

import numpy as np

from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, register
from speccore.state import Sequence


def lookup(tokens: np.ndarray, k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Tokens following the most recent earlier match of the longest suffix n-gram."""
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    family = "ngram"

    def __init__(self, cfg: ProposerConfig) -> None:
        self.k = cfg.k
        self.ngram_min = cfg.ngram_min
        self.ngram_max = cfg.ngram_max

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        chains: list[list[int]] = []
        for seq in seqs:
            budget = min(self.k, seq.remaining - 1)
            if seq.finished or budget <= 0:
                chains.append([])
                continue
            tokens = np.asarray(seq.token_ids, dtype=np.int64)
            chains.append(lookup(tokens, budget, self.ngram_min, self.ngram_max))
        return DraftTree.from_chains(chains)


@register("ngram")
def _factory(cfg: ProposerConfig, target: object) -> Proposer:
    return NgramProposer(cfg)
