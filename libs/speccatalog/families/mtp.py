"""mtp: the target's own multi-token-prediction modules draft (DeepSeek-V3's MTP);
pass-through for targets that ship them. vLLM and SGLang (NEXTN) run it; speccore not yet."""

from __future__ import annotations

from typing import Any

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    MODEL_FINGERPRINT_FACTOR,
    SGLANG,
    VLLM,
    CandidateLike,
    DraftUnavailable,
    FamilySpec,
    Known,
    Shape,
    sglang_chain,
)

K_GRID = (1, 2, 3)
# DeepSeek-V3 report: 85-90 % acceptance of the second token.
PRIOR = 0.87
# Drafting deeper than the target has MTP modules reuses the last one (heuristic, unmeasured).
REUSE_FACTOR = 0.85


class Mtp(FamilySpec):
    name = "mtp"
    summary = "the target's own multi-token-prediction heads (targets that ship them)"
    default_k = 1
    engines = frozenset({VLLM, SGLANG})

    def candidates(self, known: Known) -> list[Shape]:
        if not known.target.has_mtp:
            return []
        return [Shape(f"mtp-k{k}", self.name, k) for k in K_GRID]

    def refusal(self, candidate: CandidateLike, known: Known, fingerprint: str) -> str | None:
        if not known.target.has_mtp:
            return f"{known.target.ref} has no MTP heads"
        return super().refusal(candidate, known, fingerprint)

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        target = known.target
        if not target.has_mtp:
            raise DraftUnavailable(f"{target.ref} has no multi-token-prediction heads")
        return DraftCost(
            extra_params=target.mtp_params,
            kv_elems_per_token=target.kv_elems_per_token // target.layers,
            # Each step runs one MTP module: a decoder layer, a 2h -> h projection and the shared lm head.
            forward_params=target.layer_params + 2 * target.hidden * target.hidden + target.lm_head_params,
            forward_layers=1,
            forwards=candidate.k,
            sharded=True,
            verify_nodes=candidate.k,
        )

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        a = PRIOR * MODEL_FINGERPRINT_FACTOR[fingerprint]
        extra = candidate.k - known.target.mtp_modules
        return a * REUSE_FACTOR**extra if extra > 0 else a

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return {"method": "mtp", "num_speculative_tokens": candidate.k}

    def sglang(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return sglang_chain(candidate, "NEXTN")


SPEC = Mtp()
