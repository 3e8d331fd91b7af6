"""The gateway's decisions about T2 tune sessions, without I/O: what a session shows, event by event.

Glossary (schemas/tune.py has the tuner's): a *session* here is the TuneSessionResponse the
gateway keeps in `tune_sessions.session` and answers GET with; the *source* is what its
`tune.requested` carried of the T1 run it tunes (request, candidates table, pareto front,
winner), kept beside it so the tuned winner can be cached as that run's answer. The
projector folds the tuner's events into the session one at a time, in whatever order they
arrive (:func:`fold`); like a run's, a session's status only moves forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specbus.envelope import Envelope
from specops_schemas.api import API_PREFIX, RunCreateRequest
from specops_schemas.candidates import Candidate, CandidateResult
from specops_schemas.catalog import RunStatus
from specops_schemas.events import RunCompleted
from specops_schemas.tune import (
    TUNE_EVENT_TYPES,
    TrialResult,
    TuneCompleted,
    TuneError,
    TuneFailed,
    TuneImproved,
    TuneRequested,
    TuneSessionResponse,
    TuneSessionSummary,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneStatus,
    TuneTerminated,
    TuneTrialCompleted,
)

# The tuner's events; `tune.requested` is the gateway's own, recorded when it is published.
PROJECTED = tuple(t for t in TUNE_EVENT_TYPES if t is not TuneRequested)
TERMINAL_EVENT_TYPES = frozenset({"tune.completed", "tune.failed"})
TERMINAL_STATUSES: frozenset[TuneStatus] = frozenset({"completed", "failed"})
_RANK: dict[TuneStatus, int] = {"queued": 0, "running": 1, "completed": 2, "failed": 2}


def session_location(session_id: str) -> str:
    return f"{API_PREFIX}/tune-sessions/{session_id}"


def curve_location(session_id: str) -> str:
    return f"{session_location(session_id)}/curve.png"


# --- POST tune-sessions ---------------------------------------------------------------------


def create_conflict(run_id: str, status: RunStatus, measured: bool | None) -> str | None:
    """Why the run cannot be tuned, or None when it can (a completed run measured on this host)."""
    if status != RunStatus.COMPLETED:
        return f"run {run_id} is {status.value}; a tune session needs a completed run"
    if not measured:
        return (
            f"run {run_id} was not measured: its target cannot be measured on this host, "
            "so T2 cannot tune it (every trial is a measurement)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Source:
    """What a session's tune.requested carried of its T1 run."""

    run_id: str
    request: RunCreateRequest
    candidates: list[CandidateResult]
    pareto_front: list[str]
    winner: CandidateResult | None

    @classmethod
    def of(cls, requested: TuneRequested) -> Source:
        return cls(
            run_id=requested.request.run_id,
            request=requested.run_request,
            candidates=list(requested.run_candidates),
            pareto_front=list(requested.run_pareto_front),
            winner=requested.run_winner,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "request": self.request.model_dump(mode="json"),
            "candidates": [c.model_dump(mode="json") for c in self.candidates],
            "pareto_front": self.pareto_front,
            "winner": self.winner.model_dump(mode="json") if self.winner is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Source:
        return cls(
            run_id=data["run_id"],
            request=RunCreateRequest.model_validate(data["request"]),
            candidates=[CandidateResult.model_validate(c) for c in data["candidates"]],
            pareto_front=list(data["pareto_front"]),
            winner=CandidateResult.model_validate(data["winner"]) if data["winner"] is not None else None,
        )


def open_session(envelope: Envelope[TuneRequested]) -> TuneSessionResponse:
    """The session a tune.requested opens: queued, nothing tried yet."""
    requested = envelope.payload
    return TuneSessionResponse(
        id=requested.session_id,
        status="queued",
        created_at=envelope.occurred_at,
        updated_at=envelope.occurred_at,
        request=requested.request,
        budget_s=requested.request.budget_minutes * 60.0,
    )


# --- the fold -------------------------------------------------------------------------------------


def _moved(session: TuneSessionResponse, status: TuneStatus) -> TuneStatus:
    if session.status in TERMINAL_STATUSES or _RANK[status] < _RANK[session.status]:
        return session.status
    return status


def _best(trials: list[TrialResult], current: TrialResult | None) -> TrialResult | None:
    """The complete trial with the highest value (the earliest of equals), or `current`."""
    best = current
    for trial in trials:
        if trial.state != "complete" or trial.value is None:
            continue
        if best is None or best.value is None or (trial.value, -trial.trial) > (best.value, -best.trial):
            best = trial
    return best


def fold(session: TuneSessionResponse, envelope: Envelope[Any]) -> TuneSessionResponse:
    """The session after one more tuner event; the same object when the event moves nothing.

    A session that completed or failed keeps its answer: a late event is recorded in its
    stream but changes nothing here.
    """
    p = envelope.payload
    if session.status in TERMINAL_STATUSES:
        return session
    update: dict[str, Any]
    if isinstance(p, TuneStarted):
        update = {
            "status": _moved(session, "running"),
            "space": p.space,
            "budget_s": p.budget_s,
            "started_at": p.started_at,
            "deadline": p.deadline,
        }
    elif isinstance(p, TuneTrialCompleted):
        trials = {t.trial: t for t in session.trials} | {p.result.trial: p.result}
        ordered = [trials[n] for n in sorted(trials)]
        curve = {c.trial: c for c in session.curve} | {p.point.trial: p.point}
        update = {
            "status": _moved(session, "running"),
            "trials": ordered,
            "best": _best(ordered, session.best),
            "curve": sorted(curve.values(), key=lambda c: (c.elapsed_s, c.trial)),
        }
    elif isinstance(p, TuneImproved):
        update = {"status": _moved(session, "running"), "best": _best([p.best], session.best)}
    elif isinstance(p, TuneSpaceNarrowed):
        update = {"dropped": session.dropped | p.dropped, "importances": p.importances}
    elif isinstance(p, TuneTerminated):
        update = {"auto_terminated": True, "termination_reason": p.reason}
    elif isinstance(p, TuneCompleted):
        update = {
            "status": "completed",
            "winner": p.winner,
            "best": p.best or session.best,
            "curve": p.curve or session.curve,
            "auto_terminated": p.auto_terminated or session.auto_terminated,
            "termination_reason": p.reason,
            "downtime_s": p.downtime_s,
            "speculation_disabled": p.speculation_disabled,
        }
    elif isinstance(p, TuneFailed):
        update = {"status": "failed", "error": TuneError(error_stage=p.error_stage, message=p.message)}
    else:
        return session
    return session.model_copy(update=update)


# --- the answer -----------------------------------------------------------------------------------


def cache_answer(
    source: Source, completed: TuneCompleted, families: Sequence[str] | None = None
) -> RunCompleted | None:
    """The T1 answer a completed session leaves to the winner cache, or None (keep T1's).

    The tuned winner heads the T1 run's candidates table and pareto front (replacing a T1
    candidate of the same id), so a later run of the T1 request is answered with it. A
    session without a winner leaves the T1 run's own answer in place, and so does one whose
    `families` left out the T1 winner's family: it never measured T1's winner against its
    own, so it cannot say it beat it (its winner is still the session's, for its apply).
    """
    winner = completed.winner
    if winner is None:
        return None
    t1 = source.winner
    if families is not None and t1 is not None and t1.candidate.family not in families:
        return None
    won = winner.candidate.candidate_id
    return RunCompleted(
        run_id=completed.run_id,
        cache_hit=False,
        measured=winner.measurement is not None,
        winner=winner,
        candidates=[winner, *(c for c in source.candidates if c.candidate.candidate_id != won)],
        pareto_front=[won, *(c for c in source.pareto_front if c != won)],
    )


def session_summary(session: TuneSessionResponse, run_id: str) -> TuneSessionSummary:
    """A session's row in `GET tune-sessions`: its state and best so far, without the trials."""
    best = session.best
    return TuneSessionSummary(
        id=session.id,
        status=session.status,
        created_at=session.created_at,
        run_id=run_id,
        best_value=None if best is None else best.value,
        best_family=None if best is None else best.candidate.family,
        trials=sum(1 for trial in session.trials if trial.state != "running"),
        auto_terminated=session.auto_terminated,
        termination_reason=session.termination_reason,
    )


def apply_conflict(session: TuneSessionResponse) -> str | None:
    """Why a session's winner cannot be applied yet, or None when it can."""
    if session.status != "completed":
        return f"tune session is {session.status}; only a completed session can be applied"
    if session.winner is None:
        return "tune session completed without a winner (no trial beat the baseline)"
    return None


def pick_candidate(session: TuneSessionResponse, candidate_id: str | None) -> Candidate:
    """The winner, or the named candidate of a complete trial; LookupError if it cannot be applied."""
    if candidate_id is None:
        if session.winner is None:
            raise LookupError("the tune session has no winner")
        return session.winner.candidate
    for trial in session.trials:
        if trial.candidate.candidate_id == candidate_id:
            if trial.state != "complete":
                raise LookupError(f"candidate '{candidate_id}' was not measured and gated ({trial.state})")
            return trial.candidate
    raise LookupError(f"candidate '{candidate_id}' is not among the session's trials")


# --- the curve's markers ----------------------------------------------------------------------


def _same_config(a: Candidate, b: Candidate) -> bool:
    return a.candidate_id == b.candidate_id or a.model_dump(exclude={"candidate_id"}) == b.model_dump(
        exclude={"candidate_id"}
    )


def t1_winner_trial(session: TuneSessionResponse, t1_winner: CandidateResult | None) -> TrialResult | None:
    """The seeded trial that re-measured the T1 run's winner, if there is one."""
    if t1_winner is None:
        return None
    for trial in session.trials:
        if trial.seeded and _same_config(trial.candidate, t1_winner.candidate):
            return trial
    return None
