"""T2 Tune: the HTTP bodies of `tune-sessions` and
the events of `spec.tune.<session_id>.*`.

Flow (every event's correlation_id is the session id):

- gateway: `POST tune-sessions` -> `tune.requested` (the T1 run's request and answer ride
  along: the tuner reads no gateway table).
- tuner: `tune.started` (the search space, the budget), then per trial a `bench.requested`
  whose plan's `run_id` is the session id (one candidate next to the baseline, N reps),
  answered by the benchmark-runner's `bench.completed` and the quality gate's
  `gate.evaluated` as for a T1 run; then `tune.trial_completed` (and `tune.improved` when
  the best-so-far moved, `tune.space_narrowed` when insensitive dimensions were dropped),
  and finally `tune.terminated` (auto-termination only) + `tune.completed`, or `tune.failed`.
- gateway: folds them into the session GET and SSE read; `tune.completed`'s winner goes
  into the tenant's winner cache under the T1 run's request.

Glossary:

- *trial*: one measured configuration, numbered from 0 as Optuna numbers them.
- *value*: the trial's objective, the priority-weighted speedup score
  (`Priorities.measured_score`); higher is better. A failed trial has none.
- *sigma*: the sample standard deviation of the per-rep speedups of a trial (its
  measurement noise), the unit of the auto-termination rule.
- *best so far*: the highest value among the completed trials (gate passed) so far.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, JsonValue, model_validator

from specbus.envelope import EventPayload
from specops_schemas.api import Priorities, RunCreateRequest
from specops_schemas.base import MAX_SEED, Id, Model, UtcDatetime
from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Measurement
from specops_schemas.catalog import ErrorStage, Family

DEFAULT_BUDGET_MINUTES = 60.0
MAX_BUDGET_MINUTES = 480.0
# Share of the budget after which a session that stopped improving is auto-terminated.
AUTO_TERMINATE_AT = 0.8

TuneStatus = Literal["queued", "running", "completed", "failed"]
TrialState = Literal["running", "complete", "failed"]


# --- HTTP ------------------------------------------------------------------------------------


class TuneSessionCreateRequest(Model):
    """Body of `POST tune-sessions`."""

    run_id: Id = Field(
        description="A completed, measured T1 run of the tenant; its pareto points seed the search."
    )
    budget_minutes: float = Field(
        DEFAULT_BUDGET_MINUTES,
        gt=0.0,
        le=MAX_BUDGET_MINUTES,
        description=f"Wall-clock budget in minutes (default {DEFAULT_BUDGET_MINUTES:g}, "
        f"at most {MAX_BUDGET_MINUTES:g}); time the tuner was down counts too.",
    )
    reps: int | None = Field(
        None, ge=2, le=20, description="Reps per trial (mean and sigma need 2); None: the host's default."
    )
    priorities: Priorities | None = Field(
        None, description="Objective weights; None: the T1 run's `goal.priorities`."
    )
    families: list[Family] | None = Field(
        None, min_length=1, description="Families the search may try; None: every feasible family."
    )
    max_trials: int | None = Field(
        None, ge=1, le=10_000, description="Stop after this many trials even if budget is left."
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed of the sampler and of the measurement prompts (32 bits)."
    )


class CurvePoint(Model):
    """One point of the best-so-far curve: after a trial ended, the best value until then."""

    trial: int = Field(ge=0, description="Trial that ended.")
    elapsed_s: float = Field(ge=0.0, description="Seconds since the session started (wall clock).")
    value: float | None = Field(description="That trial's value; None if it failed.")
    best_value: float | None = Field(description="Best value of the session so far; None while none passed.")


class Dimension(Model):
    """One dimension of the search space."""

    name: str = Field(description="Parameter name, e.g. `family`, `k`, `ngram.ngram_min`.")
    choices: list[JsonValue] = Field(min_length=1, description="Values the sampler may pick.")
    family: str | None = Field(None, description="The family it belongs to; None for shared ones.")


class TrialResult(Model):
    """One trial: what was measured, how it was gated, its value."""

    trial: int = Field(ge=0, description="Trial number (0-based, Optuna's).")
    bench_id: Id = Field(description="The bench that measured it.")
    candidate: Candidate = Field(description="The configuration tried.")
    params: dict[str, JsonValue] = Field(description="The sampler's parameters for it.")
    seeded: bool = Field(description="True when it re-measures a T1 pareto point (enqueued).")
    state: TrialState = Field(description="running, complete (measured and gated) or failed.")
    value: float | None = Field(
        None, description="Objective (priority-weighted speedup); None unless complete."
    )
    speedup: float | None = Field(None, gt=0.0, description="Mean per-rep speedup over the baseline.")
    speedup_stdev: float | None = Field(None, ge=0.0, description="Sigma: stdev of the per-rep speedups.")
    measurement: Measurement | None = Field(None, description="The bench's summary of the candidate.")
    gate: GateOutcome | None = Field(None, description="The quality gate's verdict.")
    error_stage: ErrorStage | None = Field(None, description="Why it failed; None unless failed.")
    error_message: str | None = Field(None, description="Human-readable cause when failed.")
    started_at: UtcDatetime = Field(description="When its bench was requested.")
    finished_at: UtcDatetime | None = Field(None, description="When it ended.")

    @model_validator(mode="after")
    def _state_is_consistent(self) -> Self:
        if self.state == "complete" and self.value is None:
            raise ValueError("a complete trial has a value")
        if self.state == "failed" and (self.error_stage is None or not self.error_message):
            raise ValueError("a failed trial names its error_stage and error_message")
        return self


class TuneError(Model):
    """Why a session failed."""

    error_stage: ErrorStage = Field(description="Stage that failed.")
    message: str = Field(description="Human-readable cause.")


class TuneSessionResponse(Model):
    """Body of `GET tune-sessions/{id}`, and of `POST tune-sessions` (202)."""

    id: Id = Field(description="Session id.")
    status: TuneStatus = Field(description="Lifecycle stage.")
    created_at: UtcDatetime = Field(description="When the session was accepted.")
    updated_at: UtcDatetime = Field(description="Last change.")
    request: TuneSessionCreateRequest = Field(description="The request as accepted.")
    budget_s: float = Field(gt=0.0, description="Budget in seconds.")
    started_at: UtcDatetime | None = Field(None, description="When the tuner started it.")
    deadline: UtcDatetime | None = Field(None, description="started_at + budget.")
    space: list[Dimension] = Field(default_factory=list, description="The search space.")
    dropped: dict[str, JsonValue] = Field(
        default_factory=dict, description="Dimensions found insensitive, fixed at these values."
    )
    importances: dict[str, float] = Field(default_factory=dict, description="Parameter importances.")
    trials: list[TrialResult] = Field(default_factory=list, description="Every trial, by number.")
    best: TrialResult | None = Field(None, description="Best complete trial so far.")
    curve: list[CurvePoint] = Field(default_factory=list, description="Best-so-far curve.")
    curve_png: str | None = Field(None, description="URL of the curve drawn as a PNG.")
    auto_terminated: bool = Field(False, description="True when the 80 % rule ended the session early.")
    termination_reason: str | None = Field(None, description="Why the session ended.")
    speculation_disabled: str | None = Field(
        None,
        description="Set (the reason) when the session completed without a trial because the tenant's "
        "security policy opts out of speculation (F-S3).",
    )
    winner: CandidateResult | None = Field(None, description="The tuned winner once completed.")
    downtime_s: float = Field(0.0, ge=0.0, description="Wall-clock seconds no tuner was working on it.")
    error: TuneError | None = Field(None, description="Set when status is `failed`.")


class TuneSessionSummary(Model):
    """One row of `GET tune-sessions`: what a list of sessions shows without each one's trials."""

    id: Id = Field(description="Session id.")
    status: TuneStatus = Field(description="Lifecycle stage.")
    created_at: UtcDatetime = Field(description="When the session was accepted.")
    run_id: Id = Field(description="The T1 run it tunes.")
    best_value: float | None = Field(None, description="Best value so far; None while no trial passed.")
    best_family: Family | None = Field(None, description="Family of the best trial so far.")
    trials: int = Field(ge=0, description="Trials ended so far.")
    auto_terminated: bool = Field(False, description="True when the 80 % rule ended the session early.")
    termination_reason: str | None = Field(None, description="Why the session ended.")


class TuneSessionList(Model):
    """Body of `GET tune-sessions`: the tenant's sessions, newest first, one page."""

    sessions: list[TuneSessionSummary] = Field(description="Sessions, newest first.")
    next_before: Id | None = Field(
        None, description="Pass as `before` for the next (older) page; None on the last page."
    )


# --- events ----------------------------------------------------------------------------------


class TuneEvent(EventPayload):
    """Base of the events on `spec.tune.<session_id>.*`."""

    session_id: Id = Field(description="The tune session; the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.session_id


class TuneRequested(TuneEvent):
    """A client asked for a T2 session (published by the gateway)."""

    event_type = "tune.requested"
    request: TuneSessionCreateRequest = Field(description="The validated request body.")
    run_request: RunCreateRequest = Field(description="The T1 run's request: target, workload, goal.")
    run_candidates: list[CandidateResult] = Field(description="The T1 run's candidates table.")
    run_pareto_front: list[str] = Field(description="candidate_ids of the T1 run's pareto front.")
    run_winner: CandidateResult | None = Field(description="The T1 run's winner.")
    requested_by: str = Field(min_length=1, max_length=128, description="Id of the API token that asked.")
    speculation_disabled: bool = Field(
        default=False,
        description="The tenant's security policy opted out of speculation when the session was asked "
        "for (F-S3, as the gateway's read model had it): it ends without a trial.",
    )


class TuneStarted(TuneEvent):
    """The tuner created the study: space, seeds and budget clock."""

    event_type = "tune.started"
    space: list[Dimension] = Field(min_length=1, description="The search space.")
    seeded: int = Field(ge=0, description="T1 pareto points enqueued as the first trials.")
    budget_s: float = Field(gt=0.0, description="Budget in seconds.")
    started_at: UtcDatetime = Field(description="Start of the budget clock.")
    deadline: UtcDatetime = Field(description="started_at + budget_s.")


class TuneTrialCompleted(TuneEvent):
    """A trial ended, measured and gated (complete) or not (failed)."""

    event_type = "tune.trial_completed"
    result: TrialResult = Field(description="The trial.")
    point: CurvePoint = Field(description="The best-so-far curve's new point.")


class TuneImproved(TuneEvent):
    """The best-so-far moved."""

    event_type = "tune.improved"
    best: TrialResult = Field(description="The new best trial.")
    previous_value: float | None = Field(description="The best value before it; None for the first.")


class TuneSpaceNarrowed(TuneEvent):
    """Parameter importances were computed; the dimensions found insensitive (possibly none) are
    fixed from now on."""

    event_type = "tune.space_narrowed"
    importances: dict[str, float] = Field(description="Importance of each parameter (sums to 1).")
    dropped: dict[str, JsonValue] = Field(
        description="Dropped dimension -> the value it is fixed at; empty when every one mattered."
    )
    after_trials: int = Field(ge=1, description="Complete trials the importances were computed from.")


class TuneTerminated(TuneEvent):
    """The auto-termination rule fired (80 % of the budget without improving the
    top-3 by more than 1 sigma)."""

    event_type = "tune.terminated"
    reason: str = Field(min_length=1, description="The rule and its numbers, for a person.")
    elapsed_s: float = Field(ge=0.0, description="Budget spent when it fired.")
    top3_start: float = Field(description="Mean value of the top 3 when the seeded trials ended.")
    top3_now: float = Field(description="Mean value of the top 3 now.")
    sigma: float = Field(ge=0.0, description="Pooled sigma of the current top 3.")


class TuneCompleted(TuneEvent):
    """The session's answer."""

    event_type = "tune.completed"
    run_id: Id = Field(description="The T1 run it tuned.")
    run_request: RunCreateRequest = Field(description="The T1 run's request (the winner cache's key).")
    winner: CandidateResult | None = Field(
        description="Best complete trial as a candidates-table row; None if no trial beat the baseline."
    )
    baseline: Measurement | None = Field(description="The winner's bench baseline.")
    best: TrialResult | None = Field(description="The winner's trial.")
    trials: int = Field(ge=0, description="Trials run.")
    failed_trials: int = Field(ge=0, description="Trials that failed.")
    curve: list[CurvePoint] = Field(description="The best-so-far curve.")
    auto_terminated: bool = Field(description="True when the 80 % rule ended it.")
    reason: str = Field(
        min_length=1, description="Why it ended: budget, max_trials, auto-termination, space."
    )
    elapsed_s: float = Field(ge=0.0, description="Wall-clock seconds from start to end.")
    downtime_s: float = Field(ge=0.0, description="Of which no tuner was working on it.")
    speculation_disabled: str | None = Field(
        default=None,
        description="Why the session ended without a trial: the tenant's policy opts out of "
        "speculation (F-S3). None for an ordinary answer.",
    )


class TuneFailed(TuneEvent):
    """The session stopped without an answer."""

    event_type = "tune.failed"
    error_stage: ErrorStage = Field(description="Stage that failed.")
    message: str = Field(min_length=1, description="Human-readable cause, safe to show the client.")


TUNE_EVENT_TYPES: tuple[type[TuneEvent], ...] = (
    TuneRequested,
    TuneStarted,
    TuneTrialCompleted,
    TuneImproved,
    TuneSpaceNarrowed,
    TuneTerminated,
    TuneCompleted,
    TuneFailed,
)
