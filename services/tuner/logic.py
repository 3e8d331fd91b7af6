"""The tuner's decisions, without I/O: bench plans, derived ids, trial verdicts, the curve, the end.

Per session (every event's correlation_id is the session id):

- `tune.requested` -> `tune.started` + the first trial's `bench.requested` (the
  seeds, i.e. the T1 run's pareto points and winner, are asked first);
- a trial's `bench.completed` and `gate.evaluated` (any order) -> the trial ends:
  complete (measured, final verdict passed) or failed with its reason (a candidate
  failure, `quality_regression`, no final verdict); then `tune.trial_completed`,
  `tune.improved` when the best moved, `tune.space_narrowed` once importances drop
  dimensions, and the next trial's `bench.requested` or the end;
- the end: `tune.terminated` (the 80 % rule, see rule.py) + `tune.completed`, or
  `tune.completed` at the budget, `max_trials` or an exhausted space; `tune.failed`
  when the target itself cannot be measured.
- the tenant opts out of speculation (F-S3: before the session, or while it runs) ->
  its running trials fail (`validation`, the reason) and `tune.completed` with
  `speculation_disabled`, no winner; nothing its benches report later is taken.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specbus.envelope import Envelope, EventPayload, new_event
from speccatalog.hardware import resolve_profile
from specops_schemas.api import Priorities
from specops_schemas.candidates import (
    Candidate,
    CandidateResult,
    Measurement,
    Prediction,
    Sampling,
    verdict_is_final,
)
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import BenchCompleted, BenchPlan, BenchRequested
from specops_schemas.security import OPT_OUT_REASON
from specops_schemas.tune import (
    CurvePoint,
    Dimension,
    TrialResult,
    TuneCompleted,
    TuneFailed,
    TuneImproved,
    TuneRequested,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneTerminated,
    TuneTrialCompleted,
)
from specops_services.tuner import rule
from specops_services.tuner import space as search

PRODUCER = "tuner"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (
    TuneStarted,
    TuneTrialCompleted,
    TuneImproved,
    TuneSpaceNarrowed,
    TuneTerminated,
    TuneCompleted,
    TuneFailed,
    BenchRequested,
)
# uuid5 namespace of the ids this service derives (any fixed UUID would do).
ID_NAMESPACE = uuid.UUID("5e0c7d1a-2b4f-4c8e-9f3a-6d2e8b1c4a70")
# A trial whose suggestion is infeasible is failed at once and the next one asked; this
# many in a row mean the sampler finds nothing else to try.
MAX_INFEASIBLE_IN_A_ROW = 10

STOP_BUDGET = "budget spent"
STOP_MAX_TRIALS = "max_trials reached"
STOP_SPACE = "search space exhausted"


def bench_id_for(session_id: str, trial: int) -> str:
    """A trial's bench id, derived from (session, trial number): a re-ask names the same bench."""
    return f"bench-{uuid.uuid5(ID_NAMESPACE, f'{session_id}/trial/{trial}').hex}"


def priorities(requested: TuneRequested) -> Priorities:
    return requested.request.priorities or requested.run_request.goal.priorities


@dataclass(frozen=True, slots=True)
class BenchSize:
    reps: int
    n_prompts: int
    max_new_tokens: int


def bench_plan(session_id: str, requested: TuneRequested, candidate: Candidate, size: BenchSize) -> BenchPlan:
    """One trial's bench: the candidate next to the baseline, sampled as the T1 run was measured."""
    run = requested.run_request
    return BenchPlan(
        run_id=session_id,
        target=run.target,
        fingerprint=run.workload.fingerprint,
        mode=run.mode,
        quality_gate=run.goal.quality_gate,
        candidates=[candidate],
        reps=requested.request.reps or size.reps,
        n_prompts=size.n_prompts,
        max_new_tokens=size.max_new_tokens,
        sampling=Sampling.for_fingerprint(run.workload.fingerprint),
        seed=requested.request.seed,
    )


def space_of(requested: TuneRequested) -> search.Space:
    """The session's search space: the T1 run's table, the families asked for, what its
    target's engine runs on its hardware."""
    target = requested.run_request.target
    return search.build(
        requested.run_candidates,
        requested.request.families,
        engine=str(target.engine),
        gpu_kind=resolve_profile(target.gpu).kind,
    )


def seeds(requested: TuneRequested, space: search.Space) -> list[dict[str, Any]]:
    """The T1 pareto points, then the T1 winner, as parameters of the space (in the space, once each)."""
    by_id = {r.candidate.candidate_id: r.candidate for r in requested.run_candidates}
    picked = [by_id[cid] for cid in requested.run_pareto_front if cid in by_id]
    if requested.run_winner is not None:
        picked.append(requested.run_winner.candidate)
    out: list[dict[str, Any]] = []
    for c in picked:
        params = search.to_params(c, space)
        if params is not None and params not in out:
            out.append(params)
    return out


# --- a trial's verdict --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trial:
    """A trial as stored: its result so far, and the baseline its bench measured."""

    result: TrialResult
    baseline: Measurement | None = None

    @property
    def running(self) -> bool:
        return self.result.state == "running"


@dataclass(frozen=True, slots=True)
class Ending:
    """How a running trial ends: complete (value) or failed (stage, message)."""

    value: float | None = None
    stage: ErrorStage | None = None
    message: str | None = None


def measured(trial: Trial, done: BenchCompleted) -> Measurement | Ending:
    """What a trial's bench.completed says: its measurement, or how it failed."""
    cid = trial.result.candidate.candidate_id
    for failure in done.failures:
        if failure.candidate_id == cid:
            return Ending(stage=failure.error_stage, message=failure.message)
    for m in done.results:
        if m.candidate_id == cid:
            return m
    return Ending(stage=ErrorStage.BENCHMARK, message="the bench reported nothing for this candidate")


def ending(trial: Trial, method: GateMethod, prio: Priorities) -> Ending | None:
    """How the trial ends once measured and gated; None while either is missing. A trial
    does not wait for a skipped gate's verdict: it passes whatever the candidate emitted."""
    m, gate = trial.result.measurement, trial.result.gate
    if m is None or not (method == GateMethod.SKIPPED or verdict_is_final(gate, method)):
        return None
    if gate is not None and gate.passed is False:
        return Ending(
            stage=ErrorStage.QUALITY_REGRESSION,
            message=f"quality gate {gate.method} failed (score {gate.score}, threshold {gate.threshold})",
        )
    return Ending(value=prio.measured_score(m, trial.baseline))


def ended(trial: TrialResult, how: Ending, at: datetime) -> TrialResult:
    if how.value is not None:
        return trial.model_copy(update={"state": "complete", "value": how.value, "finished_at": at})
    return trial.model_copy(
        update={"state": "failed", "error_stage": how.stage, "error_message": how.message, "finished_at": at}
    )


def with_measurement(trial: TrialResult, m: Measurement) -> TrialResult:
    return trial.model_copy(
        update={"measurement": m, "speedup": m.speedup_mean or m.speedup, "speedup_stdev": m.speedup_stdev}
    )


# --- the session --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Session:
    """A session as the tuner stored it (its row, locked while a handler works on it)."""

    session_id: str
    tenant_id: str
    requested: TuneRequested
    space: list[Dimension]
    seeded: int
    budget_s: float
    started_at: datetime
    deadline: datetime
    heartbeat_at: datetime
    downtime_s: float
    dropped: dict[str, Any]
    importances: dict[str, float]
    rule_checked: bool
    auto_terminated: bool
    curve: list[CurvePoint]
    stop_reason: str | None
    ended: bool

    def search_space(self) -> search.Space:
        return space_of(self.requested)

    def elapsed_s(self, now: datetime) -> float:
        return max((now - self.started_at).total_seconds(), 0.0)


def emit(session: Session, payload: EventPayload, cause: Envelope[Any] | None) -> Envelope[Any]:
    """An event of the session, caused by `cause` (None: the budget ticker)."""
    return new_event(
        payload,
        tenant_id=session.tenant_id,
        correlation_id=session.session_id,
        producer=PRODUCER,
        causation_id=cause.event_id if cause is not None else None,
    )


def best(trials: Sequence[TrialResult]) -> TrialResult | None:
    """The best complete trial (highest value; the earlier on a tie)."""
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    return max(done, key=lambda t: (t.value or 0.0, -t.trial), default=None)


def curve_point(trial: TrialResult, trials: Sequence[TrialResult], elapsed_s: float) -> CurvePoint:
    top = best(trials)
    return CurvePoint(
        trial=trial.trial, elapsed_s=elapsed_s, value=trial.value, best_value=top.value if top else None
    )


def rule_trials(trials: Sequence[TrialResult]) -> list[rule.Done]:
    return [
        rule.Done(trial=t.trial, value=t.value, sigma=t.speedup_stdev or 0.0, seeded=t.seeded)
        for t in trials
        if t.state == "complete" and t.value is not None
    ]


def stop_reason(
    session: Session, trials: Sequence[TrialResult], now: datetime, space_size: int
) -> str | None:
    """Why no further trial is asked (budget, max_trials, space), or None."""
    if now >= session.deadline:
        return STOP_BUDGET
    limit = session.requested.request.max_trials
    if limit is not None and len(trials) >= limit:
        return STOP_MAX_TRIALS
    if len(trials) >= space_size:
        return STOP_SPACE
    return None


def narrowed(
    importances: Mapping[str, float], best_params: Mapping[str, Any], threshold: float
) -> dict[str, Any]:
    """Dimensions with importance below `threshold`, fixed at the best trial's value."""
    return {
        name: best_params[name]
        for name, imp in importances.items()
        if imp < threshold and name in best_params
    }


def winner(trial: TrialResult | None) -> CandidateResult | None:
    """The tuned winner as a candidates-table row, if it beats the baseline (speedup > 1).

    A tuned winner has no prediction of its own: its `prediction` states what was
    measured (rank 1, its value as the score, the measured acceptance, speedup and
    memory), so that the winner cache and `apply` read it as they read a T1 winner.
    """
    if trial is None or trial.measurement is None or trial.value is None or trial.measurement.speedup <= 1.0:
        return None
    m = trial.measurement
    return CandidateResult(
        candidate=trial.candidate,
        prediction=Prediction(
            rank=1,
            score=trial.value,
            acceptance_rate=m.acceptance_rate,
            mean_acceptance_length=m.mean_acceptance_length,
            speedup=m.speedup,
            extra_memory_bytes=m.extra_memory_bytes,
        ),
        measurement=m,
        gate=trial.gate,
        quality_preserved=1.0,
    )


def completed(
    session: Session, trials: Sequence[Trial], now: datetime, reason: str, *, auto_terminated: bool
) -> TuneCompleted:
    results = [t.result for t in trials]
    top = best(results)
    won = winner(top)
    baseline = next((t.baseline for t in trials if top is not None and t.result.trial == top.trial), None)
    req = session.requested
    return TuneCompleted(
        session_id=session.session_id,
        run_id=req.request.run_id,
        run_request=req.run_request,
        winner=won,
        baseline=baseline if won is not None else None,
        best=top,
        trials=len(results),
        failed_trials=sum(1 for t in results if t.state == "failed"),
        curve=session.curve,
        auto_terminated=auto_terminated,
        reason=reason,
        elapsed_s=session.elapsed_s(now),
        downtime_s=session.downtime_s,
    )


def speculation_disabled(session: Session, trials: Sequence[Trial], now: datetime) -> TuneCompleted:
    """The answer of a session whose tenant opts out of speculation (F-S3): no winner, whatever
    its trials measured before the opt-out (none, when it was asked for after), and the reason."""
    done = completed(session, trials, now, OPT_OUT_REASON, auto_terminated=session.auto_terminated)
    return done.model_copy(update={"winner": None, "baseline": None, "speculation_disabled": OPT_OUT_REASON})


def failed(session: Session, stage: ErrorStage, message: str) -> TuneFailed:
    return TuneFailed(session_id=session.session_id, error_stage=stage, message=message)


def downtime_gap(heartbeat_at: datetime, now: datetime, tick_s: float) -> float:
    """Seconds no tuner was working on a session: a heartbeat gap longer than 3 ticks, whole."""
    gap = (now - heartbeat_at).total_seconds()
    return gap if gap > 3 * tick_s else 0.0
