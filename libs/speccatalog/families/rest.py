"""rest: retrieval-based speculative decoding (He et al. 2023, arXiv:2311.08252): draft
trees from the continuations of the context's suffix in an indexed corpus (a suffix
array datastore). Needs a datastore built with the target's tokenizer; skipped for chat."""

from __future__ import annotations

from collections.abc import Mapping

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    BUILTIN_PREFIX,
    CandidateLike,
    DraftSource,
    FamilyError,
    FamilySpec,
    Knob,
    KnobValue,
    Known,
    Shape,
    slug,
)

K_GRID = (4, 8)
# speccore's REST tree holds at most nodes_per_depth * k nodes (libs/speccore/proposers/rest.py),
# and speccore verifies at most MAX_NODES a step (speccore.proposers.base.MAX_K).
NODES_PER_DEPTH = 4
MAX_NODES = 64
LOOKUP_S = 2.5e-3  # speccore's measured suffix-array lookup per step (see ngram.LOOKUP_S)
# Chain-equivalent greedy acceptance: chat measured with speccore on smollm2 (E[N] 1.46
# at k=8), the others from REST (arXiv:2311.08252: 1.62-2.36x on code) and how much
# the output copies retrievable text.
PRIORS = {
    "chat": 0.31, "code": 0.45, "rag": 0.50, "summarization": 0.40,
    "structured": 0.45, "reasoning": 0.30, "creative": 0.15, "long_context": 0.40,
}  # fmt: skip
# The built-in datastores (specprompts.corpora: stdlib sources, ShareGPT replies) on
# HumanEval-style and chat prompts, measured: E[N] 1.22 at k=8 on code.
BUILTIN_PRIORS = {"code": 0.18, "chat": 0.31}


class Rest(FamilySpec):
    name = "rest"
    summary = "retrieval: draft trees from a suffix-array datastore (--datastore)"
    proposer = "speccore.proposers.rest:make_rest"
    draft_source = DraftSource.DATASTORE
    default_k = 8
    # The defaults are the paper's CPU-sized choices; a T2 search tries the grids.
    knobs = (
        Knob("max_suffix", 16, (4, 8, 16, 32), "retrieval depth: the longest context suffix looked up"),
        Knob("min_suffix", 2, (1, 2, 3), "shortest context suffix that may match"),
        Knob("nodes_per_depth", NODES_PER_DEPTH, (1, 2, 4, 8), "draft-tree width: nodes per draft depth"),
    )
    copies_input = True
    skipped_for = frozenset({"chat"})

    def candidates(self, known: Known) -> list[Shape]:
        stores = sorted(known.datastores.values(), key=lambda s: s.datastore_id)
        return [
            Shape(f"rest-k{k}-{slug(store.datastore_id)}", self.name, k, draft=store.datastore_id)
            for store in stores
            if store.tokenizer == known.target.tokenizer
            for k in K_GRID
        ]

    def refusal(self, candidate: CandidateLike, known: Known, fingerprint: str) -> str | None:
        reason = super().refusal(candidate, known, fingerprint)
        store = known.datastores.get(candidate.draft or "")
        if (
            reason is None
            and store is not None
            and store.fingerprints
            and fingerprint not in store.fingerprints
        ):
            return f"datastore {store.datastore_id} is not built for {fingerprint} workloads"
        return reason

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        store = known.datastore(candidate)
        width = int(self.knob_values(candidate.options)["nodes_per_depth"])
        return DraftCost(
            fixed_bytes=store.size_bytes, lookup_s=LOOKUP_S, verify_nodes=tree_nodes(width, candidate.k)
        )

    def check_knobs(self, values: Mapping[str, KnobValue]) -> None:
        lo, hi = values["min_suffix"], values["max_suffix"]
        if not 1 <= lo <= hi:
            raise FamilyError(f"need 1 <= min_suffix <= max_suffix, got {lo}, {hi}")
        if values["nodes_per_depth"] < 1:
            raise FamilyError(f"nodes_per_depth must be at least 1, got {values['nodes_per_depth']}")

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        draft = candidate.draft or ""
        store = known.datastores.get(draft)
        if store is not None and store.acceptance is not None:
            return store.acceptance
        if draft.startswith(BUILTIN_PREFIX):
            return BUILTIN_PRIORS.get(fingerprint, PRIORS[fingerprint])
        return PRIORS[fingerprint]


def tree_nodes(nodes_per_depth: int, k: int) -> int:
    """Nodes of a REST draft tree (the proposer's node budget): width x depth, at most MAX_NODES."""
    return min(nodes_per_depth * k, MAX_NODES)


SPEC = Rest()
