"""medusa: K heads on the target's last hidden state predict the next K tokens; a static
tree of their top ranks is verified in one step (Cai et al. 2024, arXiv:2401.10774).
Heads are trained by T3 (`specops heads train --family medusa`)."""

from __future__ import annotations

from typing import Any

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    MODEL_FINGERPRINT_FACTOR,
    SPECCORE,
    VLLM,
    CandidateLike,
    DraftSource,
    FamilySpec,
    Known,
    Shape,
    external_draft,
    shape_label,
    slug,
)
from speccatalog.shapes import CATALOG_TREES, shape_nodes

# Spec-Bench: Medusa tau 2.31.
PRIOR = 0.50


class Medusa(FamilySpec):
    name = "medusa"
    summary = "Medusa heads (--head DIR): a static tree of the heads' top ranks"
    proposer = "speccore.proposers.medusa:make_medusa"
    draft_source = DraftSource.HEAD
    default_k = 4
    takes_tree = True
    head_artifacts = {"medusa": 1}
    engines = frozenset({SPECCORE, VLLM})  # SGLang has no Medusa

    def candidates(self, known: Known) -> list[Shape]:
        out = []
        for head in sorted(known.heads.values(), key=lambda h: h.head_id):
            if head.family != self.name or head.target_ref.lower() != known.target.ref.lower():
                continue
            shapes: list[tuple[int, tuple[int, ...] | None]] = [(head.num_heads, None)]
            shapes += [(len(t), t) for t in CATALOG_TREES if len(t) <= head.num_heads]
            out += [
                Shape(
                    f"medusa-k{k}-{shape_label(tree)}-{slug(head.head_id)}", self.name, k, head.head_id, tree
                )
                for k, tree in shapes
            ]
        return out

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        head = known.head(candidate)
        target = known.target
        params = head.params or head.num_heads * (target.hidden * target.hidden + target.lm_head_params)
        return DraftCost(
            extra_params=params,
            forward_params=params,
            forward_layers=1,
            forwards=1,
            sharded=True,
            verify_nodes=shape_nodes(candidate.tree) if candidate.tree else candidate.k,
        )

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        head = known.heads.get(candidate.draft or "")
        a = head.acceptance if head is not None and head.acceptance is not None else PRIOR
        return a * MODEL_FINGERPRINT_FACTOR[fingerprint]

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return {
            "method": "medusa",
            "model": external_draft(candidate, "vLLM", draft_path),
            "num_speculative_tokens": candidate.k,
        }


SPEC = Medusa()
