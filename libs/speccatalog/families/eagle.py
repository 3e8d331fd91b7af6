"""eagle: a draft layer over the target's features — EAGLE-1's feature-level layer (Li et
al. 2024, arXiv:2401.15077), decoded with EAGLE-2's dynamic tree (arXiv:2406.16858), or
EAGLE-3's multi-layer fusion with its own small vocabulary (arXiv:2503.01840). Heads are
trained by T3; the head-trainer writes an EAGLE-3 head's speculators export beside it,
which vLLM loads (the candidate's `export` option), so such a head is offered to vLLM runs
of its target too. Medusa and EAGLE-1 registry heads stay speccore's: vLLM reads those
from the original projects' checkpoints, SGLang EAGLE heads in its own layout."""

from __future__ import annotations

from typing import Any

from speccatalog.artifacts import HEAD_SPECULATORS_DIR, is_head_id
from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    MODEL_FINGERPRINT_FACTOR,
    SGLANG,
    SPECCORE,
    VLLM,
    CandidateLike,
    DraftSource,
    EngineRefusal,
    FamilySpec,
    Known,
    Shape,
    external_draft,
    int_option,
    shape_label,
    slug,
)
from speccatalog.shapes import CATALOG_TREES, shape_nodes

K_GRID = (3, 5)  # chain depths
# Spec-Bench tau 4.3 (EAGLE-1/2) and 5.7 (EAGLE-3), with trees.
PRIOR, EAGLE3_PRIOR = 0.72, 0.80
# EAGLE-3 drafts over a reduced vocabulary (SpecForge's llama3-8B-eagle3.json: 32000).
EAGLE3_DRAFT_VOCAB = 32_000


def version(candidate: CandidateLike) -> int:
    """The candidate's EAGLE version (its `eagle_version` option; 3 when unset)."""
    return int_option(candidate, "eagle_version") or 3


class Eagle(FamilySpec):
    name = "eagle"
    summary = "EAGLE heads (--head DIR): EAGLE-1/3 draft layers, EAGLE-2's dynamic tree"
    proposer = "speccore.proposers.eagle:make_eagle"
    draft_source = DraftSource.HEAD
    default_k = 3  # tree depth
    engine_options = frozenset({"eagle_version", "num_draft_tokens", "export"})
    takes_tree = True
    head_artifacts = {"eagle": 2, "eagle3": 3}
    engines = frozenset({SPECCORE, VLLM, SGLANG})

    def candidates(self, known: Known) -> list[Shape]:
        out = []
        for head in sorted(known.heads.values(), key=lambda h: h.head_id):
            if head.family != self.name or head.target_ref.lower() != known.target.ref.lower():
                continue
            shapes: list[tuple[int, tuple[int, ...] | None]] = [(k, None) for k in K_GRID]
            shapes += [(len(t), t) for t in CATALOG_TREES]
            out += [
                Shape(
                    f"eagle-k{k}-{shape_label(tree)}-{slug(head.head_id)}",
                    self.name,
                    k,
                    head.head_id,
                    tree,
                    options={"eagle_version": head.eagle_version}
                    | ({"export": head.export} if head.export else {}),
                )
                for k, tree in shapes
            ]
        return out

    def engine_refusal(self, candidate: CandidateLike, engine: str, *, gpu_kind: str) -> str | None:
        """A registry head reaches vLLM only as an EAGLE-3 head with its speculators export:
        vLLM's EAGLE-1 loader reads the original EAGLE checkpoints' names and SGLang its own
        EAGLE-3 layout, neither of which the head-trainer writes."""
        if engine == VLLM and is_head_id(candidate.draft):
            if version(candidate) < 3:
                return (
                    "vllm cannot load an EAGLE-1 T3 head: its eagle method reads the original EAGLE "
                    "checkpoints' layout, which specops does not export"
                )
            if candidate.options.get("export") != HEAD_SPECULATORS_DIR:
                return (
                    "vllm loads a T3 EAGLE-3 head through its speculators export, which this head lacks "
                    "(trained before the head-trainer wrote one, or for a target with no Hugging Face id)"
                )
            if candidate.tree:
                return "vLLM takes no static draft tree (speculative_token_tree was removed)"
            return None
        if engine == SGLANG and is_head_id(candidate.draft):
            return (
                "sglang cannot load a T3 head: it reads EAGLE drafts in its own layout, "
                "which specops does not write"
            )
        return super().engine_refusal(candidate, engine, gpu_kind=gpu_kind)

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        head = known.head(candidate)
        target = known.target
        vocab = EAGLE3_DRAFT_VOCAB if head.eagle_version >= 3 else 0
        fusion = (3 if head.eagle_version >= 3 else 2) * target.hidden * target.hidden
        own = head.params or target.layer_params + fusion + vocab * target.hidden
        return DraftCost(
            extra_params=own,
            kv_elems_per_token=target.kv_elems_per_token // target.layers,
            # EAGLE-1/2 read the target's lm head every draft step; EAGLE-3 its own small one.
            forward_params=own + (0 if vocab else target.lm_head_params),
            forward_layers=1,
            forwards=len(candidate.tree) if candidate.tree else candidate.k,
            sharded=True,
            verify_nodes=shape_nodes(candidate.tree) if candidate.tree else candidate.k,
        )

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        head = known.heads.get(candidate.draft or "")
        a = EAGLE3_PRIOR if head is not None and head.eagle_version >= 3 else PRIOR
        if head is not None and head.acceptance is not None:
            a = head.acceptance
        return a * MODEL_FINGERPRINT_FACTOR[fingerprint]

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return {
            "method": "eagle3" if version(candidate) >= 3 else "eagle",
            "model": _vllm_draft(candidate, draft_path),
            "num_speculative_tokens": candidate.k,
        }

    def sglang(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        tree = candidate.tree
        # --speculative-num-draft-tokens counts the verified root too.
        tokens = int_option(candidate, "num_draft_tokens") or (
            (shape_nodes(tree) + 1) if tree else candidate.k + 1
        )
        return {
            "speculative_algorithm": "EAGLE3" if version(candidate) >= 3 else "EAGLE",
            "speculative_draft_model_path": external_draft(candidate, "SGLang", draft_path),
            "speculative_num_steps": len(tree) if tree else candidate.k,
            "speculative_eagle_topk": max(tree) if tree else 1,
            "speculative_num_draft_tokens": tokens,
        }


def _vllm_draft(candidate: CandidateLike, draft_path: str | None) -> str:
    """What vLLM loads: a registry head's speculators export, in the head's directory
    (``draft_path``); any other draft as external_draft says."""
    if not (is_head_id(candidate.draft) and candidate.options.get("export") == HEAD_SPECULATORS_DIR):
        return external_draft(candidate, "vLLM", draft_path)
    if version(candidate) < 3:
        raise EngineRefusal(
            f"vLLM cannot run this candidate: only EAGLE-3 heads have a {HEAD_SPECULATORS_DIR} export"
        )
    if draft_path is None:
        raise EngineRefusal(
            f"vLLM cannot run this candidate: the directory of head {candidate.draft} is not known here"
        )
    return f"{draft_path.rstrip('/')}/{HEAD_SPECULATORS_DIR}"


SPEC = Eagle()
