"""rest: retrieval-based speculative decoding (He et al. 2023, arXiv:2311.08252): draft
trees from the continuations of the context's suffix in an indexed corpus (a suffix
array datastore). Needs a datastore built with the target's tokenizer; skipped for chat."""

from __future__ import annotations

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    BUILTIN_PREFIX,
    CandidateLike,
    DraftSource,
    FamilySpec,
    Known,
    Shape,
    slug,
)

K_GRID = (4, 8)
# speccore's REST tree holds at most NODES_PER_DEPTH * k nodes (libs/speccore/proposers/rest.py).
NODES_PER_DEPTH = 4
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
        return DraftCost(
            fixed_bytes=store.size_bytes, lookup_s=LOOKUP_S, verify_nodes=NODES_PER_DEPTH * candidate.k
        )

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        draft = candidate.draft or ""
        store = known.datastores.get(draft)
        if store is not None and store.acceptance is not None:
            return store.acceptance
        if draft.startswith(BUILTIN_PREFIX):
            return BUILTIN_PRIORS.get(fingerprint, PRIORS[fingerprint])
        return PRIORS[fingerprint]


SPEC = Rest()
