"""The runs' decisions, without I/O: a run's state folded from its events, what GET shows, what
apply may take, and when a run has stalled.

Glossary: a *run state* is what the `runs` row holds (status + result); the *projector*
folds the flow's events into it, one event at a time, in whatever order they arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from specbus.envelope import Envelope
from speccatalog.fingerprint import infer, sample_text
from specops_schemas.api import (
    InferredFingerprint,
    RunCreateBody,
    RunCreateRequest,
    RunError,
    RunStatusResponse,
    RunSummary,
    Workload,
)
from specops_schemas.base import UtcDatetime
from specops_schemas.candidates import CandidateResult
from specops_schemas.catalog import ErrorStage, Fingerprint, RunStatus
from specops_schemas.events import RunCompleted, RunFailed, RunPredicted
from specops_services.gateway.live_workload import LiveSummary

# --- roles -------------------------------------------------------------------------------


# --- tokens ------------------------------------------------------------------------------


# --- the console's session (a cookie) and its CSRF check ---------------------------------


# --- idempotency (draft-ietf-httpapi-idempotency-key-header) ------------------------------


# --- runs --------------------------------------------------------------------------------


def accept(body: RunCreateBody) -> RunCreateRequest:
    """The request a body makes: `auto` resolved to the fingerprint its samples look like (the
    inference recorded on the workload, the samples' text dropped), any other fingerprint as is."""
    stated = body.workload
    if stated.fingerprint != "auto":
        return body.accepted(Workload(fingerprint=stated.fingerprint))
    texts = [
        sample if isinstance(sample, str) else sample_text([m.model_dump() for m in sample])
        for sample in stated.samples or ()
    ]
    inference = infer(texts)
    if inference is None:  # `auto` without samples is accept_live's
        raise ValueError('fingerprint "auto" needs samples')
    inferred = InferredFingerprint(
        samples=inference.samples,
        confidence=inference.confidence,
        runner_up=Fingerprint(inference.runner_up),
        runner_up_confidence=inference.runner_up_confidence,
    )
    return body.accepted(Workload(fingerprint=Fingerprint(inference.fingerprint), inferred=inferred))


def accept_live(body: RunCreateBody, live: LiveSummary) -> RunCreateRequest:
    """`auto` without samples resolved from the tenant's live summary of the target's traffic: the
    fingerprint of the window's pooled probabilities (their sums over its requests), recorded on
    the workload with `source: live`, the window's requests and time span."""
    summary = live.summary
    sums = {f: summary.probability_sums.get(f, 0.0) for f in Fingerprint}
    (winner, top), (runner_up, second) = sorted(sums.items(), key=lambda item: item[1], reverse=True)[:2]
    inferred = InferredFingerprint(
        source="live",
        samples=summary.requests,
        confidence=min(top / summary.requests, 1.0),  # a sum of floats may pass 1 by a rounding
        runner_up=runner_up,
        runner_up_confidence=min(second / summary.requests, 1.0),
        window_s=summary.span_s,
        summarized_at=live.summarized_at,
    )
    return body.accepted(Workload(fingerprint=winner, inferred=inferred))


# Status only moves forward: events from different services may arrive out of order
# (and `run.running` with stage=measuring follows `run.predicted`), so an event whose
# status ranks below the current one is recorded in the stream but moves nothing.
_RANK: dict[RunStatus, int] = {
    RunStatus.QUEUED: 0,
    RunStatus.RUNNING: 1,
    RunStatus.PREDICTED: 2,
    RunStatus.COMPLETED: 3,
    RunStatus.FAILED: 3,
}
_STATUS_OF_EVENT: dict[str, RunStatus] = {
    "run.queued": RunStatus.QUEUED,
    "run.running": RunStatus.RUNNING,
    "run.predicted": RunStatus.PREDICTED,
    "run.completed": RunStatus.COMPLETED,
    "run.failed": RunStatus.FAILED,
}
TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED})
TERMINAL_EVENT_TYPES = frozenset({"run.completed", "run.failed"})
# `run.requested` carries the request body and is addressed to the predictor; the run's
# progress stream starts at `run.queued`, which the gateway records itself.
UNRECORDED_EVENT_TYPES = frozenset({"run.requested"})


def is_recorded(event_type: str) -> bool:
    """Whether an event of the flow belongs in the run's stream (`run_events`)."""
    return event_type not in UNRECORDED_EVENT_TYPES


def next_status(current: RunStatus, event_type: str) -> RunStatus:
    target = _STATUS_OF_EVENT.get(event_type)
    if target is None or current in TERMINAL_STATUSES or _RANK[target] < _RANK[current]:
        return current
    return target


@dataclass(frozen=True, slots=True)
class RunState:
    """The mutable part of a run: status and what the flow has found so far."""

    status: RunStatus
    cache_hit: bool = False
    measured: bool | None = None
    winner: dict[str, Any] | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    pareto_front: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    speculation_disabled: str | None = None
    fit: dict[str, Any] | None = None  # run.predicted's fit report


def fold(state: RunState, envelope: Envelope[Any]) -> RunState:
    """The run after one more event; the same state when the event moves nothing.

    A run failed because one of its messages was parked (`dead_letter`) is completed by a
    later `run.completed`: the parked message was redriven (`specops dlq redrive`) and
    carried the run to its answer.
    """
    payload = envelope.payload
    if isinstance(payload, RunCompleted) and is_redrivable(state):
        return _completed(replace(state, error=None), payload)
    status = next_status(state.status, envelope.type)
    if status == state.status:
        return state
    if isinstance(payload, RunPredicted):
        candidates = [
            CandidateResult(candidate=c.candidate, prediction=c.prediction).model_dump(mode="json")
            for c in payload.candidates
        ]
        fit = payload.fit.model_dump(mode="json") if payload.fit is not None else None
        return replace(
            state, status=status, candidates=candidates, pareto_front=list(payload.pareto_front), fit=fit
        )
    if isinstance(payload, RunCompleted):
        return _completed(state, payload)
    if isinstance(payload, RunFailed):
        error = RunError(error_stage=payload.error_stage, message=payload.message)
        return replace(state, status=status, error=error.model_dump(mode="json"))
    return replace(state, status=status)


def is_redrivable(state: RunState) -> bool:
    """Whether the run failed only because one of its messages was parked (it may still complete)."""
    error_stage = (state.error or {}).get("error_stage")
    return state.status == RunStatus.FAILED and error_stage == ErrorStage.DEAD_LETTER


def _completed(state: RunState, payload: RunCompleted) -> RunState:
    return replace(
        state,
        status=RunStatus.COMPLETED,
        cache_hit=payload.cache_hit,
        measured=payload.measured,
        winner=payload.winner.model_dump(mode="json") if payload.winner else None,
        candidates=[c.model_dump(mode="json") for c in payload.candidates],
        pareto_front=list(payload.pareto_front),
        speculation_disabled=payload.speculation_disabled,
    )


def answer_to_cache(before: RunState, after: RunState, envelope: Envelope[Any]) -> RunCompleted | None:
    """The answer a folded event leaves to the winner cache, or None.

    That is a `run.completed` that completed the run (not a late one after a failure)
    and was not itself answered from the cache: its row is the one it came from.
    """
    payload = envelope.payload
    if not isinstance(payload, RunCompleted) or payload.cache_hit or payload.speculation_disabled:
        return None
    if before.status == RunStatus.COMPLETED or after.status != RunStatus.COMPLETED:
        return None
    return payload


def run_response(
    *,
    run_id: str,
    request: RunCreateRequest,
    state: RunState,
    created_at: UtcDatetime,
    updated_at: UtcDatetime,
) -> RunStatusResponse:
    return RunStatusResponse.model_validate(
        {
            "id": run_id,
            "status": state.status,
            "created_at": created_at,
            "updated_at": updated_at,
            "request": request,
            "cache_hit": state.cache_hit,
            "measured": state.measured,
            "winner": state.winner,
            "candidates": state.candidates,
            "pareto_front": state.pareto_front,
            "error": state.error,
            "speculation_disabled": state.speculation_disabled,
            "fit": state.fit,
        }
    )


def run_summary(run: RunStatusResponse) -> RunSummary:
    """A run's row in `GET runs`: its target, workload and winner, without the candidates."""
    winner = run.winner
    return RunSummary(
        id=run.id,
        status=run.status,
        created_at=run.created_at,
        target=run.request.target,
        fingerprint=run.request.workload.fingerprint,
        winner_family=None if winner is None else winner.candidate.family,
        measured_speedup=None if winner is None or winner.measurement is None else winner.measurement.speedup,
        cache_hit=run.cache_hit,
        speculation_disabled=run.speculation_disabled,
    )


# --- listing pages ------------------------------------------------------------------------


def apply_conflict(state: RunState) -> str | None:
    """Why a run's winner cannot be applied yet, or None when it can."""
    if state.status != RunStatus.COMPLETED:
        return f"run is {state.status.value}; only a completed run can be applied"
    if state.speculation_disabled is not None:
        return f"run completed without speculation: {state.speculation_disabled}"
    if state.winner is None:
        return "run completed without a winner (no candidate beat the baseline)"
    return None


def pick_candidate(state: RunState, candidate_id: str | None) -> CandidateResult:
    """The winner, or the named candidate of the table; LookupError if it cannot be applied."""
    if candidate_id is None:
        if state.winner is None:
            raise LookupError("the run has no winner")
        return CandidateResult.model_validate(state.winner)
    for row in state.candidates:
        if row["candidate"]["candidate_id"] == candidate_id:
            chosen = CandidateResult.model_validate(row)
            if chosen.error_stage is not None:
                raise LookupError(f"candidate '{candidate_id}' was disqualified ({chosen.error_stage.value})")
            return chosen
    raise LookupError(f"candidate '{candidate_id}' is not among the run's candidates")


# --- server-sent events --------------------------------------------------------------------


# --- stalled runs (the reaper) ---------------------------------------------------------------

# Where a run waits, named for its user, read off its latest event: the service expected
# to move it next, and the stage its failure is charged to.
STALL_STAGES: dict[str, tuple[ErrorStage, str]] = {
    "queued": (ErrorStage.PREDICTION, "is a predictor running?"),
    "predicting": (ErrorStage.PREDICTION, "is a predictor running?"),
    "benchmarking": (ErrorStage.BENCHMARK, "is a benchmark-runner running?"),
    "gating": (ErrorStage.QUALITY_GATE, "are a quality-gate and a predictor running?"),
}
_STAGE_OF_EVENT: dict[str, str] = {
    "run.queued": "queued",
    "run.predicted": "benchmarking",
    "bench.requested": "benchmarking",
    "bench.rep_measured": "benchmarking",
    "bench.completed": "gating",
    "gate.evaluated": "gating",
}
_STAGE_OF_RUNNING = {"predicting": "predicting", "measuring": "benchmarking", "gating": "gating"}


@dataclass(frozen=True, slots=True)
class RunProgress:
    """A run not yet answered and its latest event (by when it happened): what the reaper judges."""

    run_id: str
    tenant_id: str
    last_type: str | None
    """The latest event's type; None for a run with no event recorded (it is queued)."""
    last_running_stage: str | None
    """`stage` of a `run.running`, when that is the latest event."""
    last_at: UtcDatetime


@dataclass(frozen=True, slots=True)
class Stall:
    """Why a run is failed: no progress in `stage` for longer than its deadline."""

    stage: str
    waited: timedelta

    def failure(self, run_id: str) -> RunFailed:
        error_stage, hint = STALL_STAGES[self.stage]
        minutes = self.waited.total_seconds() / 60
        waited = f"{minutes:.0f} min" if minutes >= 1 else f"{self.waited.total_seconds():.0f} s"
        return RunFailed(
            run_id=run_id,
            error_stage=error_stage,
            message=f"no progress in {self.stage} for {waited}: {hint} see `specops status`",
        )


def stall_stage(progress: RunProgress) -> str:
    """The stage a run waits in, from its latest event (an unknown one counts as benchmarking,
    the stage with the most generous deadline on a CPU host)."""
    if progress.last_type is None:
        return "queued"
    if progress.last_type == "run.running":
        return _STAGE_OF_RUNNING.get(progress.last_running_stage or "", "benchmarking")
    return _STAGE_OF_EVENT.get(progress.last_type, "benchmarking")


def stalled(progress: RunProgress, deadlines: Mapping[str, timedelta], now: datetime) -> Stall | None:
    """The run's stall when its stage's deadline has passed since its latest event, else None."""
    stage = stall_stage(progress)
    waited = now - progress.last_at
    return Stall(stage, waited) if waited > deadlines[stage] else None
