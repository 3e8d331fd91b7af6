"""cascade: a small draft feeds a medium model that drafts for the target (stretch goal,
behind ENABLE_L4_CASCADE; no engine implements it yet, so the catalog prunes it)."""

from __future__ import annotations

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    MODEL_FINGERPRINT_FACTOR,
    CandidateLike,
    DraftSource,
    FamilySpec,
    Known,
    Shape,
    slug,
)
from speccatalog.families.draft_model import PRIOR, model_cost

K = 4


class Cascade(FamilySpec):
    name = "cascade"
    summary = "draft -> medium -> target (stretch, behind ENABLE_L4_CASCADE)"
    draft_source = DraftSource.MODEL
    default_k = K
    engine_options = frozenset({"medium"})
    engines = frozenset()

    def candidates(self, known: Known) -> list[Shape]:
        drafts = known.target.drafts
        if not known.enable_cascade or len(drafts) < 2:
            return []
        small, medium = drafts[0], drafts[-1]
        return [
            Shape(
                f"cascade-k{K}-{slug(small)}-{slug(medium)}", self.name, K, small, options={"medium": medium}
            )
        ]

    def refusal(self, candidate: CandidateLike, known: Known, fingerprint: str) -> str | None:
        if known.target.has_mtp:
            return f"{known.target.ref} has native MTP heads; separate drafts are skipped"
        return super().refusal(candidate, known, fingerprint)

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        cost = model_cost(candidate.draft, known.target, candidate.k)
        medium = candidate.options.get("medium")
        if not isinstance(medium, str):
            return cost
        # The medium model verifies the small draft's chain once per step, then drafts for the target.
        mid = model_cost(medium, known.target, 1)
        return DraftCost(
            extra_params=cost.extra_params + mid.extra_params,
            kv_elems_per_token=cost.kv_elems_per_token + mid.kv_elems_per_token,
            forward_params=cost.forward_params,
            forward_layers=cost.forward_layers,
            forwards=candidate.k + 1,
            verify_nodes=candidate.k,
        )

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        return PRIOR * MODEL_FINGERPRINT_FACTOR[fingerprint]


SPEC = Cascade()
