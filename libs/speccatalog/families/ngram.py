"""ngram: prompt lookup — the next tokens after the latest earlier match of the last n-gram
(Saxena 2023, prompt lookup decoding). Zero weights; the fallback family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    SGLANG,
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
    sglang_chain,
)

# Host-side lookup per step, speccore's measured on the project machines
# (bench/results/*-cpu2.json: draft_time_s / verify steps); GPU engines are faster at
# it, and the CPU number keeps copy-based families honest rather than flattering them.
LOOKUP_S = 1.0e-3
K_GRID = (2, 4, 6, 8)
# (ngram_min, ngram_max): speccore's default, and a strict variant.
MATCHES = ((1, 4), (3, 5))
# Greedy per-token acceptance: chat and code measured with speccore on smollm2-135m,
# 2 CPU threads (bench/results/smollm2-135m-instruct-{chat,code}-greedy-cpu2.json: E[N]
# 1.22 / 1.60 at k=10), the others scaled by how much the output copies its input
# (Spec-Bench: prompt lookup 2.46x on summarization against 1.64x overall; the PLD
# README reports 2-4x on input-grounded tasks).
PRIORS = {
    "chat": 0.18, "code": 0.38, "rag": 0.50, "summarization": 0.55,
    "structured": 0.45, "reasoning": 0.25, "creative": 0.10, "long_context": 0.45,
}  # fmt: skip


class Ngram(FamilySpec):
    name = "ngram"
    summary = "prompt lookup: copy what followed the last n-gram's latest earlier match"
    proposer = "speccore.proposers.ngram:make_ngram"
    # On speccore's CPU kernels a verify block of up to 6 tokens costs what one token
    # costs (oneDNN runs up to 6 rows in one pass; 7-12 rows cost 1.1-1.3x), and prompt
    # lookup's mean acceptance length grows little past 5 drafts (HumanEval, smollm2:
    # 1.73 at k=5, 1.82 at k=10), so 5 is the fastest; vLLM's own ngram examples use 5.
    default_k = 5
    knobs = (
        Knob("ngram_min", 1, (1, 2, 3), "shortest suffix n-gram that may match"),
        Knob("ngram_max", 4, (3, 4, 5), "longest suffix n-gram tried first"),
    )
    # Users' names (min_match, max_match) and vLLM's (prompt_lookup_*) for the same window.
    aliases = {
        "min_match": "ngram_min",
        "max_match": "ngram_max",
        "prompt_lookup_min": "ngram_min",
        "prompt_lookup_max": "ngram_max",
    }
    copies_input = True
    engines = frozenset({SPECCORE, VLLM, SGLANG})

    def candidates(self, known: Known) -> list[Shape]:
        return [
            Shape(f"ngram-k{k}-n{lo}-{hi}", self.name, k, options={"ngram_min": lo, "ngram_max": hi})
            for k in K_GRID
            for lo, hi in MATCHES
        ]

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        return DraftCost(lookup_s=LOOKUP_S, verify_nodes=candidate.k)

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        # A longer minimum match drafts less often but more reliably (heuristic, unmeasured).
        return PRIORS[fingerprint] * (1.0 + 0.05 * (int(candidate.options.get("ngram_min", 1)) - 1))

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        """The lookup window speccore measured, defaults and aliases resolved: vLLM fills a
        missing ``prompt_lookup_*`` from k, not from speccore's defaults."""
        try:
            knobs = self.knob_values(candidate.options)
        except FamilyError as exc:
            raise EngineRefusal(f"vLLM cannot run this candidate: {exc}") from None
        return {
            "method": "ngram",
            "num_speculative_tokens": candidate.k,
            "prompt_lookup_max": knobs["ngram_max"],
            "prompt_lookup_min": knobs["ngram_min"],
        }

    def sglang(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        """A chain of k drafts from SGLang's n-gram trie, the shape speccore measured.

        SGLang's NGRAM branch (``_handle_ngram`` in
        ``python/sglang/srt/arg_groups/speculative_hook.py@004c82e07d876f6e4a0ad6e15325706b0f478f1a``)
        overwrites ``speculative_eagle_topk`` with ``speculative_ngram_max_bfs_breadth``
        (default 10), so a rendered ``--speculative-eagle-topk 1`` is lost and SGLang
        drafts a tree 10 wide; the breadth flags (min 1, max 1) are what make it a chain.
        ``--speculative-num-draft-tokens`` counts the verified root (the same file caps the
        external SAM budget at num_draft_tokens - 1), so k drafts are k + 1. The measured
        match window (ngram_min / ngram_max) has no SGLang flag any more: that version
        removed ``--speculative-ngram-{min,max}-match-window-size`` (its trie matches any
        suffix up to ``--speculative-ngram-max-trie-depth``), so it is not rendered.
        """
        chain = sglang_chain(candidate, "NGRAM")
        return {
            **chain,
            "speculative_eagle_topk": None,
            "speculative_ngram_min_bfs_breadth": 1,
            "speculative_ngram_max_bfs_breadth": 1,
        }

    def check_knobs(self, values: Mapping[str, KnobValue]) -> None:
        lo, hi = values["ngram_min"], values["ngram_max"]
        if not 1 <= lo <= hi:
            raise FamilyError(f"need 1 <= ngram_min <= ngram_max, got {lo}, {hi}")


SPEC = Ngram()
