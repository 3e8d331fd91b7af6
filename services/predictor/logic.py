"""The predictor service's decisions around plan.py and scoring.py, without I/O.

Per run (all events carry correlation_id = run id):

- `run.requested` -> `run.running(predicting)`, then `run.predicted` and either
  `bench.requested` + `run.running(measuring)` (measurable here) or `run.completed`
  with the predicted best, `measured=False` (not measurable here); `run.failed` when
  planning fails.
- `bench.completed` and `gate.evaluated`, in any order -> `run.completed(measured=True)`
  once the bench is completed and every measured candidate has a final verdict.
- `run.requested` of a tenant whose policy opts out of speculation (F-S3: the request says
  so, as the gateway's read model had it, or this service's own fold of
  `security.policy_changed` does) -> `run.completed` with `speculation_disabled` and
  nothing else: no candidate is ranked, no bench requested.
- `security.policy_changed` that opts a tenant out -> `run.completed(speculation_disabled)`
  for each of its runs planned but not answered yet (the same answer, `opted_out`); what
  their benches report later answers nothing and is not kept as measured history. A
  bench event of a tenant found opted out (a fold of an older predictor only recorded
  the policy) ends its run the same way.
- a dead letter (`spec.dlq.<service>`) holding one of the run's events ->
  `run.failed(dead_letter)`, unless the run has ended: nothing would carry it on.
  Whether it has is the predictor's own record (`RequestedRun`): its own answers, and
  the `run.failed` other services publish. The run's bench stays open, so a redrive of
  the parked message (`specops dlq redrive`) can still answer it: `run.completed`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specbus.dlq import DeadLetter
from specbus.envelope import Envelope, EventPayload, new_event
from specbus.subjects import ID_PATTERN
from speccatalog import families
from speccatalog.artifacts import HEAD_SPECULATORS_DIR
from speccatalog.hardware import resolve_profile
from speccatalog.targets import HeadRef, TargetInfo, resolve_target
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import (
    CandidateResult,
    GateOutcome,
    Measurement,
    RankedCandidate,
    verdict_is_final,
)
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import (
    BenchPlan,
    BenchRequested,
    CandidateFailure,
    RunCompleted,
    RunFailed,
    RunPredicted,
    RunRequested,
    RunRunning,
    parse_event,
)
from specops_schemas.heads import OFFERED_STATES
from specops_schemas.security import OPT_OUT_REASON
from specops_services.predictor.calibration import Calibration
from specops_services.predictor.model import HistoryRow
from specops_services.predictor.plan import HostInfo, Plan, UploadedDatastore, error_stage, plan_run
from specops_services.predictor.scoring import Decision, assemble_results, choose_winner

PRODUCER = "predictor"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (RunRunning, RunPredicted, BenchRequested, RunCompleted, RunFailed)
# uuid5 namespace of the ids this service derives (any fixed UUID would do).
ID_NAMESPACE = uuid.UUID("0b6a8f52-3c1e-4f7d-9a25-d84e61c07f39")

# nvidia-smi name fragment -> hardware profile; first match wins, so H200 precedes H100.
GPU_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("H200",), "H200"),
    (("H100",), "H100-80GB"),
    (("A100", "80GB"), "A100-80GB"),
    (("L40S",), "L40S"),
)

P = TypeVar("P", bound=EventPayload)

_ID = re.compile(ID_PATTERN)
# A dead letter's error text goes into the run's failure message; a traceback-sized one
# would drown the rest of it.
DEAD_LETTER_ERROR_CHARS = 500


def profile_of_gpu_name(name: str) -> str | None:
    """The hardware profile of a GPU as `nvidia-smi` names it, e.g. 'NVIDIA H100 80GB HBM3'."""
    upper = name.upper().replace(" ", "")
    for fragments, profile in GPU_NAMES:
        if all(f in upper for f in fragments):
            return profile
    return None


def bench_id_for(run_id: str) -> str:
    """The id of a run's T1 bench; derived, so a re-plan of the same run names the same bench."""
    return f"bench-{uuid.uuid5(ID_NAMESPACE, f'{run_id}/bench').hex}"


def _derived(envelope: Envelope[P], key: str) -> Envelope[P]:
    return envelope.model_copy(update={"event_id": str(uuid.uuid5(ID_NAMESPACE, key))})


def predicting(trigger: Envelope[RunRequested]) -> Envelope[RunRunning]:
    """`run.running(predicting)`, its id derived from the request's so a redelivery queues nothing new."""
    running = trigger.follow(RunRunning(run_id=trigger.payload.run_id, stage="predicting"), producer=PRODUCER)
    return _derived(running, f"{trigger.event_id}/run.running/predicting")


# --- planning ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanFailure:
    """Why a run could not be planned; `internal` when it is a bug rather than the request."""

    stage: ErrorStage
    message: str
    error: BaseException
    internal: bool


def failure(exc: BaseException) -> PlanFailure:
    stage = error_stage(exc)
    if stage is None:
        # The message of an unexpected error may leak internals; the log has the traceback.
        message = f"the predictor failed on this run ({type(exc).__name__}); see its log"
        return PlanFailure(ErrorStage.INTERNAL, message, exc, internal=True)
    return PlanFailure(stage, str(exc) or type(exc).__name__, exc, internal=False)


def offered_states(include_uat: bool) -> frozenset[str]:
    """The lifecycle states whose heads a run may use (schemas.heads.OFFERED_STATES)."""
    return OFFERED_STATES if include_uat else OFFERED_STATES - {"uat"}


def registry_head(
    *,
    head_id: str,
    target_ref: str,
    family: str,
    num_heads: int | None,
    eagle_version: int | None,
    params: int | None,
    artifact_path: str | None,
    acceptance_rate: float | None,
    speculators_path: str | None = None,
) -> HeadRef | None:
    """A registry head as the catalog sees it: its artifact family mapped to the catalog
    family that decodes it (eagle3 -> eagle, version 3; eagle -> eagle, version 2; medusa
    -> medusa), the gate's measured acceptance as its acceptance, and its speculators
    export, if the head-trainer wrote one, as what vLLM loads (offered to vLLM runs of its
    target; no other engine loads a registry head but speccore). None for an artifact
    family no catalog family decodes."""
    decoders = {a: spec for spec in families.families().values() for a in spec.head_artifacts}
    spec = decoders.get(family)
    if spec is None:
        return None
    return HeadRef(
        head_id=head_id,
        family=spec.name,
        target_ref=target_ref,
        num_heads=num_heads or 1,
        eagle_version=eagle_version or spec.head_artifacts[family],
        params=params or 0,
        acceptance=acceptance_rate,
        path=artifact_path,
        export=HEAD_SPECULATORS_DIR if speculators_path else None,
    )


def make_plan(
    request: RunCreateRequest,
    *,
    run_id: str,
    host: HostInfo,
    history: Sequence[HistoryRow],
    target: TargetInfo | None,
    enable_cascade: bool,
    datastores: Sequence[UploadedDatastore] = (),
    heads: Sequence[HeadRef] = (),
    calibrations: Sequence[Calibration] = (),
) -> Plan | PlanFailure:
    """plan_run, with its errors turned into the run's failure.

    ``datastores``: the corpora the run's tenant uploaded (and no other tenant's: F-S1),
    offered to the catalog as built with the target's tokenizer. ``heads``: the run's
    tenant's registry heads it may use (db.tenant_heads: production, uat when asked).
    """
    try:
        info = target or resolve_target(request.target.model_ref)
        return plan_run(
            request,
            run_id=run_id,
            host=host,
            history=history,
            target=info,
            available_datastores=[d.ref(info) for d in datastores],
            available_heads=heads,
            enable_cascade=enable_cascade,
            calibrations=calibrations,
        )
    except Exception as exc:
        # plan_run is pure: whatever it raises now it raises on every retry, so the run
        # fails at once instead of after the bus's retries and a dead letter.
        return failure(exc)


def failed(trigger: Envelope[Any], problem: PlanFailure) -> Envelope[RunFailed]:
    payload = RunFailed(run_id=trigger.correlation_id, error_stage=problem.stage, message=problem.message)
    return trigger.follow(payload, producer=PRODUCER)


def predicted_answer(plan: Plan, request: RunCreateRequest) -> RunCompleted:
    """The answer for a target that cannot be measured here: the predicted best, unmeasured."""
    rows = assemble_results(plan.ranked, gate_method=request.goal.quality_gate)
    decision = choose_winner(rows, priorities=request.goal.priorities, baseline=None)
    return _completed(plan.run_id, decision)


def opted_out(run_id: str) -> RunCompleted:
    """The answer of a run whose tenant opts out of speculation (F-S3): no candidate, no winner,
    nothing measured, and the reason."""
    return RunCompleted(
        run_id=run_id,
        cache_hit=False,
        measured=False,
        winner=None,
        candidates=[],
        pareto_front=[],
        speculation_disabled=OPT_OUT_REASON,
    )


def speculation_disabled(trigger: Envelope[RunRequested]) -> Envelope[RunCompleted]:
    """The answer of a run requested after its tenant opted out: nothing planned or measured."""
    return trigger.follow(opted_out(trigger.payload.run_id), producer=PRODUCER)


def answered_events(trigger: Envelope[RunRequested], plan: Plan, answer: RunCompleted) -> list[Envelope[Any]]:
    """What a plan that cannot be measured here publishes, in order."""
    return [
        trigger.follow(plan.run_predicted(), producer=PRODUCER),
        trigger.follow(answer, producer=PRODUCER),
    ]


def measuring_events(trigger: Envelope[RunRequested], plan: Plan, bench_id: str) -> list[Envelope[Any]]:
    """What a plan measured here publishes, in order."""
    if plan.bench_plan is None:
        raise ValueError(f"run {plan.run_id} is not measurable here: {plan.not_measurable_reason}")
    requested = BenchRequested(bench_id=bench_id, plan=plan.bench_plan)
    measuring = RunRunning(run_id=plan.run_id, stage="measuring")
    return [
        trigger.follow(plan.run_predicted(), producer=PRODUCER),
        trigger.follow(requested, producer=PRODUCER),
        trigger.follow(measuring, producer=PRODUCER),
    ]


# --- measured answer -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bench:
    """A run's bench as the predictor stored it: the plan, then what bench.completed reported."""

    bench_id: str
    run_id: str
    tenant_id: str
    request: RunCreateRequest
    plan: BenchPlan
    baseline: Measurement | None = None
    results: list[Measurement] | None = None  # None until bench.completed
    failures: list[CandidateFailure] = field(default_factory=list)
    finalized: bool = False
    """The run is answered: measured and finalized, or failed (a dead letter of its flow)."""

    @property
    def completed(self) -> bool:
        return self.results is not None


def is_ready(bench: Bench, gates: Mapping[str, GateOutcome]) -> bool:
    """Whether the run can be answered: bench completed, every measured candidate has its final
    verdict (`verdict_is_final`)."""
    if bench.results is None or bench.finalized:
        return False
    method = bench.plan.quality_gate
    return all(verdict_is_final(gates.get(m.candidate_id), method) for m in bench.results)


def measured_answer(
    bench: Bench, ranked: Sequence[RankedCandidate], gates: Mapping[str, GateOutcome]
) -> RunCompleted:
    """The measured answer: the best qualified candidate against the bench's baseline."""
    if bench.results is None or bench.baseline is None:
        raise ValueError(f"bench {bench.bench_id} is not completed")
    rows = assemble_results(
        ranked,
        gate_method=bench.plan.quality_gate,
        measurements={m.candidate_id: m for m in bench.results},
        gates=gates,
        failures=bench.failures,
    )
    decision = choose_winner(rows, priorities=bench.request.goal.priorities, baseline=bench.baseline)
    return _completed(bench.run_id, decision)


def answer_event(bench: Bench, trigger: Envelope[Any], payload: RunCompleted | RunFailed) -> Envelope[Any]:
    """The run's final event, caused by the bench or gate event that completed the picture."""
    return new_event(
        payload,
        tenant_id=bench.tenant_id,
        correlation_id=bench.run_id,
        producer=PRODUCER,
        causation_id=trigger.event_id,
    )


def _completed(run_id: str, decision: Decision) -> RunCompleted:
    return RunCompleted(
        run_id=run_id,
        cache_hit=False,
        measured=decision.measured,
        winner=decision.winner,
        candidates=decision.candidates,
        pareto_front=decision.pareto_front,
    )


# --- dead letters ---------------------------------------------------------------------------

# The run's own end: a dead letter of one does not re-decide the run, it only says that
# a service could not take the news.
_RUN_ENDS = frozenset({RunCompleted.event_type, RunFailed.event_type})


def parked_event(letter: DeadLetter) -> Envelope[Any] | None:
    """The event a dead letter keeps; None when its body is not one (malformed, another letter)."""
    try:
        return parse_event(letter.data)
    except ValueError:
        return None


def parked_run(parked: Envelope[Any]) -> str | None:
    """The run a parked event would leave unfinished (its correlation id); None if it can name none.

    Runs and tenants have ids of the subject grammar; another value names no run (and
    would fail the `spec_id` domain check of a query).
    """
    if parked.type in _RUN_ENDS or not all(map(_ID.fullmatch, (parked.correlation_id, parked.tenant_id))):
        return None
    return parked.correlation_id


@dataclass(frozen=True, slots=True)
class RequestedRun:
    """A run as the predictor knows it: requested here (run.requested), and whether it has ended."""

    run_id: str
    tenant_id: str
    ended: bool


def can_fail(run: RequestedRun | None) -> bool:
    """Whether a dead letter may still fail a run: it was requested here and has not ended.

    None is no run of the tenant that was requested here (e.g. a tune session's bench);
    an ended run was answered (by this predictor, whose answer may not be projected yet)
    or failed by another service.
    """
    return run is not None and not run.ended


def is_final(failed: RunFailed) -> bool:
    """Whether a run.failed ends the run for good; one for a parked message (`dead_letter`) is
    undone when the message is redriven and carries the run to its answer."""
    return failed.error_stage != ErrorStage.DEAD_LETTER


def dead_letter_failed(letter: DeadLetter, parked: Envelope[Any]) -> Envelope[RunFailed]:
    """`run.failed(dead_letter)` for the run of a parked event, caused by that event.

    Its id is derived from the run, so however many of a run's events are parked (and
    however often their letters arrive), the run is failed by one event.
    """
    error = letter.brief_error(DEAD_LETTER_ERROR_CHARS)
    message = (
        f"{letter.service} gave up on {parked.type} ({letter.subject}) after {letter.deliveries} "
        f"deliveries and parked it on the dead-letter queue: {error} (once that is fixed, an "
        "operator can redrive it: `specops dlq ls`, `specops dlq redrive`)"
    )
    payload = RunFailed(run_id=parked.correlation_id, error_stage=ErrorStage.DEAD_LETTER, message=message)
    return _derived(
        parked.follow(payload, producer=PRODUCER), f"{parked.correlation_id}/run.failed/dead_letter"
    )


# --- what the answer teaches -------------------------------------------------------------------


def history_rows(plan: BenchPlan, rows: Sequence[CandidateResult]) -> list[HistoryRow]:
    """measured_history rows from a measured answer; a failed gate's acceptance is not trusted."""
    gpu = resolve_profile(plan.target.gpu).name
    learned = []
    for row in rows:
        m = row.measurement
        if m is None or row.error_stage == ErrorStage.QUALITY_REGRESSION:
            continue
        c = row.candidate
        learned.append(
            HistoryRow(
                family=c.family,
                fingerprint=plan.fingerprint,
                temperature=plan.sampling.temperature,
                k=c.k,
                acceptance=m.acceptance_rate,
                speedup=m.speedup,
                # Below 1 means nothing was verified (the field counts the bonus token).
                mean_acceptance_length=m.mean_acceptance_length if m.mean_acceptance_length >= 1.0 else None,
                tree=tuple(c.tree) if c.tree else None,
                draft=c.draft,
                target_ref=plan.target.model_ref,
                gpu=gpu,
                weight=float(m.reps),
            )
        )
    return learned
