"""The toy family's proposer for speccore: k copies of the token `toy_stride` positions back."""

from __future__ import annotations

from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, knob_values
from speccore.state import Sequence


class ToyProposer(Proposer):
    family = "toy"

    def __init__(self, cfg: ProposerConfig) -> None:
        self.k = cfg.k
        self.stride = int(knob_values(self.family, cfg)["toy_stride"])

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        chains = []
        for seq in seqs:
            ids, budget = seq.token_ids, min(self.k, seq.remaining - 1)
            fits = not seq.finished and budget > 0 and len(ids) >= self.stride
            chains.append([ids[-self.stride]] * budget if fits else [])
        return DraftTree.from_chains(chains)


def make_toy(cfg: ProposerConfig, target: object) -> Proposer:
    return ToyProposer(cfg)
