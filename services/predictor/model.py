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

Priors: each family's spec (speccatalog.families.<family>) gives the greedy per-token
acceptance for a fingerprint and says where its numbers come from. Sampling
(temperature > 0) lowers acceptance: drafts that copy the input (argmax-style: ngram,
rest, lookahead) x0.8, model drafts x0.9 (vLLM PR #16899: argmax drafts lose
acceptance at high temperature).

History rows (past measurements) refine the prior: the posterior ``a`` is a weighted
average of the prior (worth PRIOR_STRENGTH rows) and each row's observed ``a``; rows of
another target or another draft count less. Rows of the same target and GPU also
correct the cost model by the geometric mean of measured / modelled speedup.

A calibration (calibration.py) of the target on this hardware profile goes further: it
scales the family's prior, adds its rows to the history, and gives a measured shape its
measured mean acceptance length and step cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from speccatalog import families
from speccatalog.costs import DraftCost
from speccatalog.families.base import DraftUnavailable, Known
from speccatalog.hardware import Deployment, extra_per_device
from speccatalog.targets import TargetInfo
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Family, Fingerprint
from specops_services.predictor.calibration import Calibration, CalibrationRow

TemperatureBucket = Literal["greedy", "sampled"]

MAX_ACCEPTANCE = 0.95
# Each further sibling at a tree depth is accepted half as often as the one before it.
SIBLING_DECAY = 0.5
PRIOR_STRENGTH = 2.0
OTHER_TARGET_WEIGHT = 0.3
OTHER_DRAFT_WEIGHT = 0.3
_SAMPLED_FACTOR = {True: 0.8, False: 0.9}  # keyed by the family's copies_input


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
    candidate: Candidate, known: Known, fingerprint: Fingerprint, temperature: float
) -> float:
    """Per-token acceptance before any measurement of this candidate: its family's prior,
    lowered under sampling (see the module docstring)."""
    spec = families.family(candidate.family)
    a = spec.prior(candidate, known, fingerprint)
    if temperature_bucket(temperature) == "sampled":
        a *= _SAMPLED_FACTOR[spec.copies_input]
    return min(max(a, 0.0), MAX_ACCEPTANCE)


def draft_cost(candidate: Candidate, known: Known) -> DraftCost:
    """Memory and work of `candidate` beside the target (its family's cost model)."""
    return families.family(candidate.family).draft_cost(candidate, known)


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
    if not families.family(candidate.family).copies_input and row.draft != candidate.draft:
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
    known: Known,
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
            cost = draft_cost(shape, known)
        except DraftUnavailable:
            continue
        modelled = _speedup_at(dep, cost, row.k, mean_length(observed, row.k, row.tree), latency_batch)
        num += row.weight * math.log(row.speedup / modelled)
        den += row.weight
    return math.exp(num / den)


def calibration_history(rows: Sequence[CalibrationRow], target_ref: str, gpu: str) -> list[HistoryRow]:
    """A calibration's rows as history rows of its target and hardware profile (greedy, batch 1)."""
    return [
        HistoryRow(
            family=r.candidate.family,
            fingerprint=r.fingerprint,
            temperature=0.0,
            k=r.candidate.k,
            acceptance=r.acceptance,
            speedup=r.speedup,
            mean_acceptance_length=r.mean_acceptance_length if r.mean_acceptance_length >= 1.0 else None,
            tree=tuple(r.candidate.tree) if r.candidate.tree else None,
            draft=r.candidate.draft,
            target_ref=target_ref,
            gpu=gpu,
        )
        for r in rows
    ]


def predict(
    candidate: Candidate,
    dep: Deployment,
    workload: Workload,
    known: Known,
    *,
    gpu: str,
    history: Sequence[HistoryRow] = (),
    calibration: Calibration | None = None,
) -> Estimate:
    """Acceptance, mean acceptance length, speedups and extra memory of `candidate` on `dep`
    (`known`: the target's drafts, heads and datastores, as the catalog saw them; `calibration`:
    used when it is of this target and hardware profile)."""
    target = dep.target
    cost = draft_cost(candidate, known)
    prior = prior_acceptance(candidate, known, workload.fingerprint, workload.temperature)
    if calibration is not None and not calibration.applies(target.ref, gpu):
        calibration = None
    if calibration is not None:
        prior = min(prior * calibration.scale(str(candidate.family)), MAX_ACCEPTANCE)
        history = [*history, *calibration_history(calibration.rows, target.ref, gpu)]
    a = refine_acceptance(prior, candidate, target, workload.fingerprint, workload.temperature, history)
    e_n = mean_length(a, candidate.k, candidate.tree)
    t1 = step_times(dep, cost, 1)
    correction = _cost_correction(candidate, dep, gpu, history, known, workload.latency_batch)
    latency = _speedup_at(dep, cost, candidate.k, e_n, workload.latency_batch) * correction
    measured = calibration.shape(candidate) if calibration is not None else None
    if measured is not None and workload.latency_batch == 1:
        # A shape measured here: its MAL (greedy, this fingerprint) and the wall clock's step
        # cost replace the model's; their ratio to the model carries to throughput.
        greedy_mal = measured.mean_acceptance_length.get(workload.fingerprint)
        if greedy_mal is not None and temperature_bucket(workload.temperature) == "greedy":
            e_n, a = greedy_mal, invert_mean_length(greedy_mal, candidate.k, candidate.tree)
        latency = e_n / measured.cost(workload.fingerprint)
        correction = latency / _speedup_at(dep, cost, candidate.k, e_n, workload.latency_batch)
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
