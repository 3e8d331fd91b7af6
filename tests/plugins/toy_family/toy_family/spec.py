"""The toy family's spec: draft k copies of an earlier token (torch-free, as specs must be)."""

from __future__ import annotations

from speccatalog.costs import DraftCost
from speccatalog.families.base import CandidateLike, FamilySpec, Knob, Known, Shape


class Toy(FamilySpec):
    name = "toy"
    summary = "repeat an earlier token k times (a family from an installed package)"
    proposer = "toy_family.proposer:make_toy"
    default_k = 3
    knobs = (Knob("toy_stride", 1, (1, 2), "draft the token this many positions back"),)
    copies_input = True

    def candidates(self, known: Known) -> list[Shape]:
        return [
            Shape(f"toy-k{k}-s{stride}", self.name, k, options={"toy_stride": stride})
            for k in (2, 3)
            for stride in (1, 2)
        ]

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        return DraftCost(lookup_s=1e-4, verify_nodes=candidate.k)

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        return 0.2


SPEC = Toy()
