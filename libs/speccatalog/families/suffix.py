"""suffix: SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; Arctic Inference, vLLM's
``suffix`` method) — drafts from suffix trees that count what followed each recent pattern:
one over the request's prompt and output so far, one per scope (tenant, F-S1) over earlier
requests' outputs. Speculation grows with the match length; zero weights.

The knobs carry vLLM's option names and defaults (the installed vLLM's ``SpeculativeConfig``,
speccatalog.engine_args), so a candidate renders to vLLM as measured; ``use_tree_spec``
(Arctic's name) drafts the paper's greedy tree instead of a path, which speccore verifies
and vLLM does not draft.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    SPECCORE,
    VLLM,
    CandidateLike,
    EngineRefusal,
    FamilyError,
    FamilySpec,
    Knob,
    KnobValue,
    Known,
    Shape,
)

DEPTH = "suffix_decoding_max_tree_depth"
CACHED = "suffix_decoding_max_cached_requests"
FACTOR = "suffix_decoding_max_spec_factor"
MIN_PROB = "suffix_decoding_min_token_prob"
TREE = "use_tree_spec"
# Host-side work per step, speccore's trees in Python: a match walk per match length over
# two trees; measured 0.7 ms a step (ngram: 0.32) on the agentic set, smollm2, 2 CPU threads
# (`specops bench --workload agentic --n-prompts 48`: draft_time_s / verify_steps).
LOOKUP_S = 0.7e-3
# Budget: drafts are cut by the match length first (at most FACTOR tokens per matched
# token), so a large budget costs only where matches are long (vLLM's docs suggest 16-32).
# The factor matters more: on the agentic set (48 prompts x 2 reps, smollm2; bench/results/
# smollm2-135m-instruct-agentic48-suffix-greedy-cpu2.json) factor 2 as a tree took 3.82
# tokens a step against 3.23 for vLLM's default path (factor 1): 2.39x none against 2.25x.
K = 16
FACTORS = (1.0, 2.0)
# Chain-equivalent greedy acceptance. Where nothing repeats across requests, suffix drafts
# what prompt lookup does (ngram's measured priors: chat and code on smollm2); where
# requests repeat earlier outputs (structured, agentic) the paper measures up to 5.3x on
# AgenticSQL and 1.9x over Token Recycling, a model-free method like prompt lookup, so the
# repetitive fingerprints sit above ngram's. Heuristic until measured here.
PRIORS = {
    "chat": 0.20, "code": 0.42, "rag": 0.55, "summarization": 0.55,
    "structured": 0.65, "reasoning": 0.28, "creative": 0.10, "long_context": 0.50,
}  # fmt: skip


class Suffix(FamilySpec):
    name = "suffix"
    summary = "suffix decoding: frequency-ranked drafts from per-request and per-tenant suffix trees"
    proposer = "speccore.proposers.suffix:make_suffix"
    default_k = 16
    knobs = (
        Knob(DEPTH, 24, (16, 24, 32), "deepest pattern plus draft the trees hold"),
        Knob(CACHED, 10000, (1000, 10000), "earlier requests' outputs a scope's global tree keeps"),
        Knob(FACTOR, 1.0, (0.5, 1.0, 2.0), "draft at most this many tokens per matched token"),
        Knob(MIN_PROB, 0.1, (0.05, 0.1, 0.2), "smallest estimated probability a draft token may have"),
        Knob(TREE, 0, (0, 1), "1: the paper's greedy draft tree; 0: a path, as vLLM drafts"),
    )
    copies_input = True
    cross_request = True
    engines = frozenset({SPECCORE, VLLM})
    # vLLM's suffix method imports Snowflake's Arctic Inference, which vLLM does not depend on.
    engine_packages = {VLLM: ("arctic-inference",)}

    def candidates(self, known: Known) -> list[Shape]:
        return [
            Shape(
                f"suffix-k{K}{'' if factor == 1 else f'-f{factor:g}'}-{'tree' if tree else 'path'}",
                self.name,
                K,
                options={TREE: tree} if factor == 1 else {TREE: tree, FACTOR: factor},
            )
            for factor in FACTORS
            for tree in (0, 1)
        ]

    def engine_refusal(self, candidate: CandidateLike, engine: str, *, gpu_kind: str) -> str | None:
        if engine == VLLM and candidate.options.get(TREE):
            return "vLLM's suffix method drafts a path, not the greedy tree (use_tree_spec)"
        return super().engine_refusal(candidate, engine, gpu_kind=gpu_kind)

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        return DraftCost(lookup_s=LOOKUP_S, verify_nodes=candidate.k)

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        return PRIORS[fingerprint]

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        knobs = self.knob_values(candidate.options)
        if knobs[TREE]:
            raise EngineRefusal("vLLM cannot run this candidate: its suffix method drafts a path")
        return {
            "method": "suffix",
            "num_speculative_tokens": candidate.k,
            **{name: knobs[name] for name in (DEPTH, CACHED, FACTOR, MIN_PROB)},
        }

    def check_knobs(self, values: Mapping[str, KnobValue]) -> None:
        # vLLM's own checks (SpeculativeConfig._validate_suffix_decoding).
        if values[DEPTH] < 1:
            raise FamilyError(f"{DEPTH} must be at least 1, got {values[DEPTH]}")
        if values[CACHED] < 0:
            raise FamilyError(f"{CACHED} must be at least 0 (0: no global tree), got {values[CACHED]}")
        if values[FACTOR] < 0:
            raise FamilyError(f"{FACTOR} must be at least 0, got {values[FACTOR]}")
        if not 0 <= values[MIN_PROB] <= 1:
            raise FamilyError(f"{MIN_PROB} must be within [0, 1], got {values[MIN_PROB]}")
        if values[TREE] not in (0, 1):
            raise FamilyError(f"{TREE} is 0 (a path) or 1 (a tree), got {values[TREE]}")


SPEC = Suffix()
