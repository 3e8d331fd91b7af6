"""draft_model: a smaller causal LM with the target's tokenizer drafts a chain (Leviathan et
al. 2023, arXiv:2211.17192); or ``self:N``, the target's first N layers (speccore only)."""

from __future__ import annotations

from typing import Any

from speccatalog.costs import DraftCost
from speccatalog.families.base import (
    MODEL_FINGERPRINT_FACTOR,
    SELF_PREFIX,
    SGLANG,
    SPECCORE,
    VLLM,
    CandidateLike,
    DraftSource,
    DraftUnavailable,
    FamilySpec,
    Known,
    Shape,
    external_draft,
    int_option,
    sglang_chain,
    slug,
)
from speccatalog.targets import KNOWN_TARGETS, TargetInfo

K_GRID = (2, 4, 6)
# Same-family drafts: Leviathan et al. 2023 report a = 0.5-0.8.
PRIOR = 0.62
# An untrained self:N draft (the target's first N of L layers) scales by (N/L)^2.2, fitted
# to the measured smollm2 self:12 of 30: E[N] 1.09 at k=4, a = 0.08.
SELF_DRAFT_EXPONENT = 2.2


def self_layers(draft: str, target: TargetInfo) -> int:
    """N of a `self:N` draft (the target's first N layers), validated against the target."""
    try:
        n = int(draft.removeprefix(SELF_PREFIX))
    except ValueError:
        raise DraftUnavailable(f"bad draft '{draft}': expected self:N with N a number of layers") from None
    if not 1 <= n < target.layers:
        raise DraftUnavailable(f"draft '{draft}' needs 1 <= N < {target.layers} layers of {target.ref}")
    return n


def model_cost(ref: str | None, target: TargetInfo, k: int) -> DraftCost:
    """A draft model drafting k tokens a step in k sequential forwards."""
    if ref is None:
        raise DraftUnavailable("a draft_model candidate needs a draft (a model ref or self:N)")
    if ref.startswith(SELF_PREFIX):
        n = self_layers(ref, target)
        # speccore's truncated copy shares the target's modules: only its KV cache is extra.
        return DraftCost(
            kv_elems_per_token=target.kv_elems_per_token * n // target.layers,
            forward_params=n * target.layer_params + target.lm_head_params,
            forward_layers=n,
            forwards=k,
            verify_nodes=k,
        )
    draft = KNOWN_TARGETS.get(ref)
    if draft is None:
        raise DraftUnavailable(f"unknown draft model '{ref}'")
    if draft.tokenizer != target.tokenizer:
        raise DraftUnavailable(f"draft '{ref}' does not share the tokenizer of {target.ref}")
    return DraftCost(
        extra_params=draft.params,
        kv_elems_per_token=draft.kv_elems_per_token,
        forward_params=draft.active,
        forward_layers=draft.layers,
        forwards=k,
        verify_nodes=k,
    )


class DraftModel(FamilySpec):
    name = "draft_model"
    summary = "a smaller model with the target's tokenizer drafts (--draft REF, or self:N layers)"
    proposer = "speccore.proposers.draft_model:make_draft_model"
    draft_source = DraftSource.MODEL
    default_k = 4
    engine_options = frozenset({"draft_tensor_parallel_size"})
    engines = frozenset({SPECCORE, VLLM, SGLANG})

    def candidates(self, known: Known) -> list[Shape]:
        target = known.target
        halves = sorted({f"{SELF_PREFIX}{max(1, target.layers // d)}" for d in (4, 2)})
        return [
            Shape(f"draft_model-k{k}-{slug(draft)}", self.name, k, draft=draft)
            for draft in (*target.drafts, *halves)
            for k in K_GRID
        ]

    def refusal(self, candidate: CandidateLike, known: Known, fingerprint: str) -> str | None:
        if known.target.has_mtp:
            return f"{known.target.ref} has native MTP heads; separate drafts are skipped"
        return super().refusal(candidate, known, fingerprint)

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        return model_cost(candidate.draft, known.target, candidate.k)

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        draft = candidate.draft or ""
        a = PRIOR * MODEL_FINGERPRINT_FACTOR[fingerprint]
        if draft.startswith(SELF_PREFIX):
            a *= (self_layers(draft, known.target) / known.target.layers) ** SELF_DRAFT_EXPONENT
        return a

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return {
            "method": "draft_model",
            "model": external_draft(candidate, "vLLM", draft_path),
            "num_speculative_tokens": candidate.k,
            # 1 or the target's TP; 1 is always valid.
            "draft_tensor_parallel_size": int_option(candidate, "draft_tensor_parallel_size") or 1,
        }

    def sglang(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        return sglang_chain(candidate, "STANDALONE", external_draft(candidate, "SGLang", draft_path))


SPEC = DraftModel()
