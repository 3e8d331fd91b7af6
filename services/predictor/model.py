"""The acceptance-rate and speedup predictor.

Glossary:

- ``a``: per-token acceptance, the chance that a draft token is accepted given that
  every token before it was. Families that draft dynamic trees (rest, lookahead) are
  described by their *chain-equivalent* ``a``: the chain acceptance that yields the
  same mean acceptance length at the candidate's depth ``k``.
- ``E[N]``: mean acceptance length, tokens emitted per verify step **including** the
  bonus token: ``(1 - a^(k+1)) / (1 - a)`` for a chain of k drafts (Leviathan et al.
  2023, arXiv:2211.17192, eq. 1).
- speedup: ``E[N] / (1 + draft_cost_ratio * k + verify_overhead)`` where
  ``draft_cost_ratio`` is the drafting time per draft token and ``verify_overhead``
  the extra time of verifying the draft block (plus step bookkeeping), both in units
  of one plain decode step. Step times come from a roofline on the hardware profile:
  ``layers * overhead + max(bytes read / bandwidth, FLOPs / FLOP/s)``.

Priors (greedy, per family x fingerprint) and where they come from:

- ngram / rest / lookahead on chat and code: measured with speccore on
  smollm2-135m-instruct, 2 CPU threads (bench/results/smollm2-135m-instruct-{chat,code}-
  greedy-cpu2.json), converted to the chain-equivalent ``a`` at the measured depth:
  ngram E[N] 1.22 / 1.60 at k=10, lookahead 1.51 / 1.81 at k=3, rest (chat) 1.46 at k=8,
  rest (code, the built-in stdlib datastore) 1.22 at k=8. Other fingerprints scale with
  how much the output copies its input: Spec-Bench (hemingkx/Spec-Bench, A100 Vicuna-7B)
  gives prompt lookup 2.46x on summarization against 1.64x overall; the PLD README
  reports 2-4x on input-grounded tasks; REST (arXiv:2311.08252) 1.62-2.36x on code.
- draft_model 0.62: same-family drafts, Leviathan et al. 2023 report a = 0.5-0.8.
  ``self:N`` (the target's first N of L layers, untrained) scales by (N/L)^2.2, fitted
  to the measured smollm2 self:12 of 30: E[N] 1.09 at k=4, a = 0.08.
- medusa 0.50 (Spec-Bench: Medusa tau 2.31), eagle 0.72 (EAGLE-1/2) and 0.80 (EAGLE-3;
  Spec-Bench tau 4.3 / 5.7 with trees), mtp 0.87 (DeepSeek-V3 report: 85-90 % acceptance
  of the second token; deeper drafts reuse the one module, x0.85 per extra position,
  a heuristic). Model-based families gain ~8 % on code and structured output
  (EAGLE-3 Table 1: HumanEval tau 6.74 vs MT-bench 6.13) and lose on creative text.
- Sampling (temperature > 0) lowers acceptance: argmax-style drafts (ngram, rest,
  lookahead) x0.8, model drafts x0.9 (vLLM PR #16899: argmax drafts lose acceptance at
  high temperature).

History rows (past measurements) refine the prior: the posterior ``a`` is a weighted
average of the prior (worth PRIOR_STRENGTH rows) and each row's observed ``a``; rows of
another target or another draft count less. Rows of the same target and GPU also
correct the cost model by the geometric mean of measured / modelled speedup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from speccatalog.hardware import Deployment, extra_per_device
from speccatalog.targets import DatastoreRef, HeadRef, TargetInfo
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Family, Fingerprint
from specops_services.predictor.resources import (
    BUILTIN_PREFIX,
    SELF_PREFIX,
    DraftCost,
    DraftUnavailable,
    draft_cost,
    self_layers,
)

TemperatureBucket = Literal["greedy", "sampled"]
F = Fingerprint

COPY_FAMILIES = frozenset({Family.NGRAM, Family.REST, Family.LOOKAHEAD})
MAX_ACCEPTANCE = 0.95
# Each further sibling at a tree depth is accepted half as often as the one before it.
SIBLING_DECAY = 0.5
SELF_DRAFT_EXPONENT = 2.2
PRIOR_STRENGTH = 2.0
OTHER_TARGET_WEIGHT = 0.3
OTHER_DRAFT_WEIGHT = 0.3

_COPY_PRIORS: dict[Family, dict[Fingerprint, float]] = {
    Family.NGRAM: {
        F.CHAT: 0.18, F.CODE: 0.38, F.RAG: 0.50, F.SUMMARIZATION: 0.55,
        F.STRUCTURED: 0.45, F.REASONING: 0.25, F.CREATIVE: 0.10, F.LONG_CONTEXT: 0.45,
    },
    Family.REST: {
        F.CHAT: 0.31, F.CODE: 0.45, F.RAG: 0.50, F.SUMMARIZATION: 0.40,
        F.STRUCTURED: 0.45, F.REASONING: 0.30, F.CREATIVE: 0.15, F.LONG_CONTEXT: 0.40,
    },
    Family.LOOKAHEAD: {
        F.CHAT: 0.37, F.CODE: 0.52, F.RAG: 0.50, F.SUMMARIZATION: 0.50,
        F.STRUCTURED: 0.50, F.REASONING: 0.40, F.CREATIVE: 0.25, F.LONG_CONTEXT: 0.45,
    },
}  # fmt: skip
# The built-in stdlib datastore on HumanEval-style prompts (measured, see above).
BUILTIN_DATASTORE_ACCEPTANCE = {F.CODE: 0.18, F.CHAT: 0.31}
_MODEL_PRIORS: dict[Family, float] = {
    Family.DRAFT_MODEL: 0.62,
    Family.CASCADE: 0.62,
    Family.MEDUSA: 0.50,
    Family.EAGLE: 0.72,
    Family.MTP: 0.87,
}
EAGLE3_ACCEPTANCE = 0.80
# Drafting deeper than the target has MTP modules reuses the last one (heuristic, unmeasured).
MTP_REUSE_FACTOR = 0.85
_MODEL_FINGERPRINT_FACTOR: dict[Fingerprint, float] = {
    F.CHAT: 1.0, F.CODE: 1.08, F.RAG: 1.03, F.SUMMARIZATION: 1.0,
    F.STRUCTURED: 1.08, F.REASONING: 1.05, F.CREATIVE: 0.85, F.LONG_CONTEXT: 0.97,
}  # fmt: skip
_SAMPLED_FACTOR = {True: 0.8, False: 0.9}  # keyed by "is a copy family"


def temperature_bucket(temperature: float) -> TemperatureBucket:
    return "greedy" if temperature <= 0.0 else "sampled"


def expected_tokens(a: float, k: int) -> float:
    """E[N] = (1 - a^(k+1)) / (1 - a): tokens per verify step of a k-token chain, bonus included."""
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= a <= 1 and k >= 0, got a={a}, k={k}")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_tokens_tree(a: float, tree: Sequence[int]) -> float:
    """E[N] of a static tree ([4, 2, 1]: 4 children of the root, 2 of each of those, ...).

    Depth d is reached when one of its tree[d] siblings is accepted; the i-th sibling
    (0-based) is accepted with a * SIBLING_DECAY^i. A chain ([1] * k) gives expected_tokens(a, k).
    """
    total, reach = 1.0, 1.0
    for width in tree:
        miss = math.prod(1.0 - a * SIBLING_DECAY**i for i in range(width))
        reach *= 1.0 - miss
        total += reach
    return total


def mean_length(a: float, k: int, tree: Sequence[int] | None) -> float:
    return expected_tokens_tree(a, tree) if tree else expected_tokens(a, k)


def invert_mean_length(target: float, k: int, tree: Sequence[int] | None = None) -> float:
    """The per-token acceptance a whose E[N] at this shape is `target` (clamped to [0, 1])."""
    lo, hi = 0.0, 1.0
    if target <= mean_length(lo, k, tree):
        return 0.0
    if target >= mean_length(hi, k, tree):
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_length(mid, k, tree) < target else (lo, mid)
    return (lo + hi) / 2


def prior_acceptance(
    candidate: Candidate,
    target: TargetInfo,
    fingerprint: Fingerprint,
    temperature: float,
    *,
    heads: Mapping[str, HeadRef] | None = None,
    datastores: Mapping[str, DatastoreRef] | None = None,
) -> float:
    """Per-token acceptance before any measurement of this candidate (see the module docstring)."""
    family = candidate.family
    draft = candidate.draft or ""
    if family in COPY_FAMILIES:
        a = _COPY_PRIORS[family][fingerprint]
        store = (datastores or {}).get(draft)
        if store is not None and store.acceptance is not None:
            a = store.acceptance
        elif family == Family.REST and draft.startswith(BUILTIN_PREFIX):
            a = BUILTIN_DATASTORE_ACCEPTANCE.get(fingerprint, a)
        if family == Family.NGRAM:
            # A longer minimum match drafts less often but more reliably (heuristic, unmeasured).
            a *= 1.0 + 0.05 * (int(candidate.options.get("ngram_min", 1)) - 1)
    else:
        a = _MODEL_PRIORS[family]
        head = (heads or {}).get(draft)
        if family == Family.EAGLE and head is not None and head.eagle_version >= 3:
            a = EAGLE3_ACCEPTANCE
        if head is not None and head.acceptance is not None:
            a = head.acceptance
        a *= _MODEL_FINGERPRINT_FACTOR[fingerprint]
        if family == Family.MTP and candidate.k > target.mtp_modules:
            a *= MTP_REUSE_FACTOR ** (candidate.k - target.mtp_modules)
        if family == Family.DRAFT_MODEL and draft.startswith(SELF_PREFIX):
            a *= (self_layers(draft, target) / target.layers) ** SELF_DRAFT_EXPONENT
    if temperature_bucket(temperature) == "sampled":
        a *= _SAMPLED_FACTOR[family in COPY_FAMILIES]
    return min(max(a, 0.0), MAX_ACCEPTANCE)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One past measurement; the service persists these from bench results."""

    family: Family
    fingerprint: Fingerprint
    temperature: float
    k: int
    acceptance: float  # accepted / drafted (Measurement.acceptance_rate)
    speedup: float  # measured, against no speculation in the same reps
    mean_acceptance_length: float | None = None  # preferred over `acceptance` when present
    tree: tuple[int, ...] | None = None
    draft: str | None = None
    target_ref: str | None = None
    gpu: str | None = None
    weight: float = 1.0  # e.g. reps measured

    def observed_acceptance(self) -> float | None:
        """The per-token a this row shows, or None if it cannot be recovered."""
        if self.mean_acceptance_length is not None:
            return invert_mean_length(self.mean_acceptance_length, self.k, self.tree)
        if self.tree:
            return None  # accepted / drafted of a tree mixes siblings that can never all be accepted
        # For a chain accepted / drafted = (E[N] - 1) / k.
        return invert_mean_length(1.0 + self.acceptance * self.k, self.k)


def _relevance(row: HistoryRow, candidate: Candidate, target: TargetInfo) -> float:
    w = row.weight
    if row.target_ref != target.ref:
        w *= OTHER_TARGET_WEIGHT
    if candidate.family not in COPY_FAMILIES and row.draft != candidate.draft:
        w *= OTHER_DRAFT_WEIGHT
    return max(w, 0.0)


def refine_acceptance(
    prior: float,
    candidate: Candidate,
    target: TargetInfo,
    fingerprint: Fingerprint,
    temperature: float,
    history: Sequence[HistoryRow],
) -> float:
    """Posterior per-token acceptance: weighted average of the prior and matching history rows."""
    bucket = temperature_bucket(temperature)
    num, den = PRIOR_STRENGTH * prior, PRIOR_STRENGTH
    for row in history:
        if (row.family, row.fingerprint, temperature_bucket(row.temperature)) != (
            candidate.family,
            fingerprint,
            bucket,
        ):
            continue
        observed = row.observed_acceptance()
        if observed is None:
            continue
        w = _relevance(row, candidate, target)
        num += w * observed
        den += w
    return min(num / den, MAX_ACCEPTANCE)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Times of one plain decode step and of one speculative step, seconds."""

    decode_s: float
    verify_s: float  # target forward over the pending token and the draft block
    draft_s: float  # draft forwards and lookups of one step
    overhead_s: float  # speculative bookkeeping

    @property
    def spec_s(self) -> float:
        return self.verify_s + self.draft_s + self.overhead_s

    def draft_cost_ratio(self, k: int) -> float:
        """Drafting time per draft token, in decode steps."""
        return self.draft_s / (k * self.decode_s)

    @property
    def verify_overhead(self) -> float:
        """Extra verify and bookkeeping time of a speculative step, in decode steps."""
        return (self.verify_s - self.decode_s + self.overhead_s) / self.decode_s


def _forward_s(
    dep: Deployment, *, params: int, layers: int, kv_elems: int, tokens: int, batch: int, devices: int
) -> float:
    profile = dep.profile
    # Decoding reads the KV cache of a sequence half-way through its working context on average.
    read = params * dep.dtype_bytes + batch * (dep.context_tokens // 2) * kv_elems * dep.dtype_bytes
    flops = 2.0 * params * tokens * batch
    return layers * profile.layer_overhead_s + max(
        read / (profile.bandwidth * devices), flops / (profile.flops * devices)
    )


def step_times(dep: Deployment, cost: DraftCost, batch: int) -> StepTimes:
    target = dep.target

    def target_forward(tokens: int) -> float:
        return _forward_s(
            dep,
            params=target.active,
            layers=target.layers,
            kv_elems=target.kv_elems_per_token,
            tokens=tokens,
            batch=batch,
            devices=dep.devices,
        )

    draft = cost.lookup_s
    if cost.forwards:
        draft += cost.forwards * _forward_s(
            dep,
            params=cost.forward_params,
            layers=cost.forward_layers,
            kv_elems=cost.kv_elems_per_token,
            tokens=1,
            batch=batch,
            devices=dep.devices if cost.sharded else 1,
        )
    return StepTimes(
        target_forward(1), target_forward(1 + cost.verify_nodes), draft, dep.profile.spec_step_overhead_s
    )


def speedup(mean_tokens: float, k: int, draft_cost_ratio: float, verify_overhead: float) -> float:
    """E[N] / (1 + draft_cost_ratio * k + verify_overhead)."""
    return mean_tokens / (1.0 + draft_cost_ratio * k + verify_overhead)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The predictor's expectation for one candidate."""

    candidate: Candidate
    acceptance: float  # per-token a after history
    mean_acceptance_length: float
    draft_cost_ratio: float  # drafting time per draft token / decode step (batch 1)
    verify_overhead: float  # extra verify + bookkeeping time / decode step (batch 1)
    latency_speedup: float  # per-stream tokens/s ratio at the latency batch
    throughput_speedup: float  # aggregate tokens/s ratio at the throughput batch, memory included
    extra_memory_bytes: int


@dataclass(frozen=True, slots=True)
class Workload:
    """The serving point the predictor evaluates candidates at."""

    fingerprint: Fingerprint
    temperature: float
    latency_batch: int
    throughput_batch: int


def _speedup_at(dep: Deployment, cost: DraftCost, k: int, mean_tokens: float, batch: int) -> float:
    t = step_times(dep, cost, batch)
    return speedup(mean_tokens, k, t.draft_cost_ratio(k), t.verify_overhead)


def _throughput_speedup(dep: Deployment, cost: DraftCost, k: int, mean_tokens: float, batch: int) -> float:
    base_seqs = min(batch, dep.sequences_that_fit())
    extra = extra_per_device(replace(dep, batch=0), cost)
    draft_kv = cost.kv_elems_per_token * dep.dtype_bytes * dep.context_tokens
    spec_seqs = min(batch, dep.sequences_that_fit(extra, draft_kv))
    if base_seqs == 0 or spec_seqs == 0:
        return 1e-3
    base = base_seqs / step_times(dep, cost, base_seqs).decode_s
    spec = spec_seqs * mean_tokens / step_times(dep, cost, spec_seqs).spec_s
    return max(spec / base, 1e-3)


def _cost_correction(
    candidate: Candidate,
    dep: Deployment,
    gpu: str,
    history: Sequence[HistoryRow],
    heads: Mapping[str, HeadRef] | None,
    datastores: Mapping[str, DatastoreRef] | None,
    latency_batch: int,
) -> float:
    """Geometric-mean ratio measured / modelled speedup over rows of this target, GPU and family."""
    num, den = 0.0, PRIOR_STRENGTH
    for row in history:
        if (row.family, row.target_ref, row.gpu) != (
            candidate.family,
            dep.target.ref,
            gpu,
        ) or row.speedup <= 0:
            continue
        observed = row.observed_acceptance()
        if observed is None:
            continue
        shape = Candidate(
            candidate_id="history",
            family=row.family,
            draft=row.draft if row.draft is not None else candidate.draft,
            k=row.k,
            tree=list(row.tree) if row.tree else None,
            options=candidate.options,
        )
        try:
            cost = draft_cost(shape, dep.target, heads=heads, datastores=datastores)
        except DraftUnavailable:
            continue
        modelled = _speedup_at(dep, cost, row.k, mean_length(observed, row.k, row.tree), latency_batch)
        num += row.weight * math.log(row.speedup / modelled)
        den += row.weight
    return math.exp(num / den)


def predict(
    candidate: Candidate,
    dep: Deployment,
    workload: Workload,
    *,
    gpu: str,
    history: Sequence[HistoryRow] = (),
    heads: Mapping[str, HeadRef] | None = None,
    datastores: Mapping[str, DatastoreRef] | None = None,
) -> Estimate:
    """Acceptance, mean acceptance length, speedups and extra memory of `candidate` on `dep`."""
    target = dep.target
    cost = draft_cost(candidate, target, heads=heads, datastores=datastores)
    prior = prior_acceptance(
        candidate, target, workload.fingerprint, workload.temperature, heads=heads, datastores=datastores
    )
    a = refine_acceptance(prior, candidate, target, workload.fingerprint, workload.temperature, history)
    e_n = mean_length(a, candidate.k, candidate.tree)
    t1 = step_times(dep, cost, 1)
    correction = _cost_correction(candidate, dep, gpu, history, heads, datastores, workload.latency_batch)
    latency = _speedup_at(dep, cost, candidate.k, e_n, workload.latency_batch) * correction
    throughput = _throughput_speedup(dep, cost, candidate.k, e_n, workload.throughput_batch) * correction
    return Estimate(
        candidate=candidate,
        acceptance=a,
        mean_acceptance_length=e_n,
        draft_cost_ratio=t1.draft_cost_ratio(candidate.k),
        verify_overhead=t1.verify_overhead,
        latency_speedup=max(latency, 1e-3),
        throughput_speedup=max(throughput, 1e-3),
        extra_memory_bytes=cost.extra_bytes(dep.dtype_bytes, dep.context_tokens, workload.latency_batch),
    )
