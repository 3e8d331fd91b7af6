"""Payloads of the T1 flow: gateway -> predictor -> benchmark-runner -> quality-gate -> predictor
(the T2 flow's are in `specops_schemas.tune`, the registry's in `specops_schemas.registry`).

Each payload class names its `event_type` (`<aggregate>.<event>`); EVENT_TYPES maps
that string back to the class, which is how consumers and `parse_event` decode.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from specbus.envelope import Envelope, EventPayload, decode_event
from specops_schemas.api import FitReport, RunCreateRequest, Target
from specops_schemas.base import Fraction, Id, Model
from specops_schemas.candidates import (
    BASELINE_ID,
    Candidate,
    CandidateResult,
    GateOutcome,
    Measurement,
    RankedCandidate,
    Sampling,
)
from specops_schemas.catalog import ErrorStage, Fingerprint, GateMethod, Mode
from specops_schemas.heads import HEAD_EVENT_TYPES
from specops_schemas.registry import REGISTRY_EVENT_TYPES
from specops_schemas.security import SECURITY_EVENT_TYPES
from specops_schemas.serve import SERVE_EVENT_TYPES
from specops_schemas.tune import TUNE_EVENT_TYPES


class RunEvent(EventPayload):
    """Base of the events on `spec.run.<run_id>.*`."""

    run_id: Id = Field(description="The run; the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.run_id


class BenchEvent(EventPayload):
    """Base of the events on `spec.bench.<bench_id>.*` and `spec.gate.<bench_id>.*`."""

    bench_id: Id = Field(description="The bench (one measurement job); the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.bench_id


class RunRequested(RunEvent):
    """A client asked for a T1 run (published by the gateway)."""

    event_type = "run.requested"
    request: RunCreateRequest = Field(description="The validated request body.")
    requested_by: str = Field(min_length=1, max_length=128, description="Id of the API token that asked.")
    speculation_disabled: bool = Field(
        default=False,
        description="The tenant's security policy opted out of speculation when the run was asked "
        "for (F-S3, as the gateway's read model had it): the run is answered without speculating.",
    )


class RunQueued(RunEvent):
    """The run is accepted and waits for a predictor.

    Version 2 carries the run's request, so the stream alone rebuilds every run (a
    cache hit publishes no `run.requested`); version 1 events have none.
    """

    event_type = "run.queued"
    schema_version = 2
    request: RunCreateRequest | None = Field(
        None, description="The validated request body (always set by the gateway since version 2)."
    )

    @model_serializer(mode="wrap")
    def _omit_missing_request(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A version 1 event serialises to the bytes it was published (and audited) with.
        data: dict[str, Any] = handler(self)
        if self.request is None:
            data.pop("request", None)
        return data


class RunRunning(RunEvent):
    """The run entered a working stage."""

    event_type = "run.running"
    stage: Literal["predicting", "measuring", "gating"] = Field(description="Stage just started.")


class RunPredicted(RunEvent):
    """Ranked candidates from the acceptance predictor, before any measurement."""

    event_type = "run.predicted"
    candidates: list[RankedCandidate] = Field(
        min_length=1, description="Feasible candidates, best rank first."
    )
    pareto_front: list[str] = Field(description="candidate_ids on the speedup / extra-memory pareto front.")
    fit: FitReport | None = Field(
        None, description="The target's memory fit on the requested GPUs and what the predictions assume."
    )

    @model_validator(mode="after")
    def _front_is_listed(self) -> Self:
        _check_ids_listed(self.pareto_front, {c.candidate.candidate_id for c in self.candidates})
        return self


class BenchPlan(Model):
    """What a bench measures and how; the gate reads the same plan."""

    run_id: Id = Field(description="Run (or tune session) the bench serves.")
    target: Target = Field(description="Target model, GPU and engine.")
    fingerprint: Fingerprint = Field(description="Workload whose prompt set is measured.")
    mode: Mode = Field(description="Serving pressure (interactive is batch=1).")
    quality_gate: GateMethod = Field(description="Gate method the candidates must pass.")
    candidates: list[Candidate] = Field(
        min_length=1, description="Candidates to measure next to the baseline."
    )
    reps: int = Field(ge=1, le=100, description="Repetitions; every candidate and the baseline run in each.")
    n_prompts: int = Field(ge=1, le=10_000, description="Prompts sampled from the fingerprint's set.")
    max_new_tokens: int = Field(ge=1, le=32_768, description="Tokens generated per prompt.")
    sampling: Sampling = Field(default_factory=Sampling, description="Sampling parameters for every method.")
    seed: int = Field(0, description="Seed of prompt sampling and of sampled decoding.")

    @model_validator(mode="after")
    def _ids_are_unique(self) -> Self:
        ids = [c.candidate_id for c in self.candidates]
        if len(set(ids)) != len(ids) or BASELINE_ID in ids:
            raise ValueError(f"candidate_ids must be unique and not {BASELINE_ID!r}")
        return self


class BenchRequested(BenchEvent):
    """The predictor asks the benchmark-runner to measure candidates."""

    event_type = "bench.requested"
    plan: BenchPlan = Field(description="What to measure.")


class RepMetrics(Model):
    """speccore's per-generation metrics (libs/speccore/metrics.py), summed over a rep's prompts."""

    prompt_tokens: int = Field(ge=0, description="Prompt tokens processed.")
    cached_prompt_tokens: int = Field(
        default=0, ge=0, description="Of them, taken from the prefix cache instead of prefilled."
    )
    new_tokens: int = Field(ge=0, description="Tokens generated.")
    verify_steps: int = Field(ge=0, description="Target forward passes that verified drafts.")
    drafted_tokens: int = Field(ge=0, description="Draft tokens proposed.")
    accepted_tokens: int = Field(ge=0, description="Draft tokens accepted.")
    rollbacks: int = Field(ge=0, description="Verify steps that rejected at least one draft token.")
    draft_time_s: float = Field(ge=0.0, description="Seconds spent drafting.")
    verify_time_s: float = Field(ge=0.0, description="Seconds spent in target verification.")
    ttft_s: float = Field(ge=0.0, description="Time to first token, seconds.")
    total_time_s: float = Field(ge=0.0, description="Wall time of the generations, seconds.")
    extra_memory_bytes: int = Field(ge=0, description="Peak memory on top of the target and its KV cache.")
    drafted_per_position: list[int] = Field(description="Draft tokens proposed at each depth.")
    accepted_per_position: list[int] = Field(description="Draft tokens accepted at each depth.")
    acceptance_rate: Fraction = Field(description="accepted_tokens / drafted_tokens (0 when none drafted).")
    mean_acceptance_length: float = Field(ge=0.0, description="Tokens per verify step, bonus token included.")
    per_position_acceptance: list[Fraction] = Field(description="Acceptance rate at each depth.")
    tpot_s: float = Field(ge=0.0, description="Time per output token after the first, seconds.")
    tokens_per_s: float = Field(ge=0.0, description="new_tokens / total_time_s.")


class BenchRepMeasured(BenchEvent):
    """One rep of one method measured (the baseline included)."""

    event_type = "bench.rep_measured"
    candidate_id: str = Field(description=f"Candidate measured, or '{BASELINE_ID}' for no speculation.")
    rep: int = Field(ge=0, description="0-based rep index.")
    reps: int = Field(ge=1, description="Reps planned in total.")
    metrics: RepMetrics = Field(description="speccore metrics of this rep.")
    speedup: float | None = Field(
        None,
        gt=0.0,
        description="tokens/s over the baseline's in the same rep; None for the baseline itself.",
    )


class CandidateFailure(Model):
    """A candidate that could not be measured (e.g. its draft does not load or fit)."""

    candidate_id: str = Field(description="The candidate.")
    error_stage: ErrorStage = Field(description="Where it failed.")
    message: str = Field(description="Human-readable cause.")


class BenchCompleted(BenchEvent):
    """Every rep is done; the quality gate evaluates the measured candidates next."""

    event_type = "bench.completed"
    plan: BenchPlan = Field(description="The plan that was measured.")
    baseline: Measurement = Field(description="The no-speculation reference.")
    results: list[Measurement] = Field(description="One summary per measured candidate.")
    failures: list[CandidateFailure] = Field(default_factory=list, description="Candidates that failed.")

    @model_validator(mode="after")
    def _results_are_planned(self) -> Self:
        ids = [m.candidate_id for m in self.results] + [f.candidate_id for f in self.failures]
        _check_ids_listed(ids, {c.candidate_id for c in self.plan.candidates})
        return self


class GateEvaluated(GateOutcome, BenchEvent):
    """The quality gate's verdict on one measured candidate."""

    event_type = "gate.evaluated"
    candidate_id: str = Field(description="The candidate gated.")

    def outcome(self) -> GateOutcome:
        """The verdict alone, without the bench and candidate it is about."""
        return GateOutcome.model_validate(self.model_dump(exclude={"bench_id", "candidate_id"}))


class RunCompleted(RunEvent):
    """The run's answer: the winner and the full candidates table."""

    event_type = "run.completed"
    cache_hit: bool = Field(description="True when served from the 30-day winner cache.")
    measured: bool = Field(
        description="True when the winner was measured here; False when the target cannot run here "
        "and the winner is the predicted best, unmeasured."
    )
    winner: CandidateResult | None = Field(
        description="Best qualified candidate; None if none beats the baseline."
    )
    candidates: list[CandidateResult] = Field(description="Every candidate considered, by predicted rank.")
    pareto_front: list[str] = Field(description="candidate_ids on the speedup / extra-memory pareto front.")
    speculation_disabled: str | None = Field(
        default=None,
        description="Why the run ended without speculation (the tenant's policy opts out, F-S3): "
        "nothing was measured, no candidate is offered. None for an ordinary answer.",
    )

    @model_validator(mode="after")
    def _winner_is_consistent(self) -> Self:
        if self.speculation_disabled is not None and (self.winner is not None or self.candidates):
            raise ValueError("a run ended as speculation_disabled offers no candidate")
        ids = {c.candidate.candidate_id for c in self.candidates}
        _check_ids_listed(self.pareto_front, ids)
        if self.winner is not None:
            _check_ids_listed([self.winner.candidate.candidate_id], ids)
            if self.measured != (self.winner.measurement is not None):
                raise ValueError("`measured` must be true exactly when the winner has a measurement")
            if self.winner.error_stage is not None:
                raise ValueError("a disqualified candidate cannot be the winner")
        return self


class RunFailed(RunEvent):
    """The run stopped without an answer."""

    event_type = "run.failed"
    error_stage: ErrorStage = Field(description="Stage that failed.")
    message: str = Field(min_length=1, description="Human-readable cause, safe to show the client.")


# The T1 flow's events (what a run's SSE stream shows).
RUN_FLOW_TYPES: tuple[type[EventPayload], ...] = (
    RunRequested,
    RunQueued,
    RunRunning,
    RunPredicted,
    BenchRequested,
    BenchRepMeasured,
    BenchCompleted,
    GateEvaluated,
    RunCompleted,
    RunFailed,
)
# Every event type on `spec.>`, by its `type` string.
EVENT_TYPES: dict[str, type[EventPayload]] = {
    cls.event_type: cls
    for cls in (
        *RUN_FLOW_TYPES,
        *TUNE_EVENT_TYPES,
        *REGISTRY_EVENT_TYPES,
        *HEAD_EVENT_TYPES,
        *SERVE_EVENT_TYPES,
        *SECURITY_EVENT_TYPES,
    )
}


def _check_ids_listed(ids: list[str], known: set[str]) -> None:
    unknown = sorted(set(ids) - known)
    if unknown:
        raise ValueError(f"candidate_ids not among the candidates: {', '.join(unknown)}")


def parse_event(data: bytes | str) -> Envelope[Any]:
    """Decode an event of any registered type; ValueError (incl. ValidationError) if it is not one."""
    return decode_event(data, EVENT_TYPES)
