"""What the quality-gate service does with a `bench.completed`, decided without I/O.

Per bench: `run.running(stage="gating")` once, then one `gate.evaluated` per measured
candidate (candidates in `failures` were never measured and are not gated), or
`run.failed(error_stage="quality_gate")` when the target cannot be loaded here.

Redelivery: a candidate whose verdict is stored is not gated again (`to_gate`), and
the run-level events carry ids derived from the bench id, so queueing one again is
a no-op in the outbox, and dropped by the broker's dedup and the consumers' inboxes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TypeVar

from pydantic import JsonValue

from specbus.envelope import Envelope, EventPayload
from specops_schemas.candidates import Candidate, GateOutcome, Top5Evidence, verdict_is_final
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import BenchCompleted, GateEvaluated, RunFailed, RunRunning
from specops_schemas.heads import HeadFailed, HeadGated, HeadGateResult, HeadTrained

PRODUCER = "quality-gate"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (RunRunning, GateEvaluated, RunFailed, HeadGated, HeadFailed)
# uuid5 namespace of the event ids this service derives (any fixed UUID would do).
EVENT_NAMESPACE = uuid.UUID("5b0f3c4e-9a51-4d3e-8f1a-6c2d7e9b0a14")

P = TypeVar("P", bound=EventPayload)


def to_gate(bench: BenchCompleted, stored: Mapping[str, GateOutcome]) -> list[Candidate]:
    """Measured candidates still without their final verdict (`verdict_is_final`: a stored
    `pending` placeholder is gated again unless the method is `pending`), in plan order."""
    measured = {m.candidate_id for m in bench.results}
    method = bench.plan.quality_gate
    return [
        c
        for c in bench.plan.candidates
        if c.candidate_id in measured and not verdict_is_final(stored.get(c.candidate_id), method)
    ]


def gating_started(event: Envelope[BenchCompleted]) -> Envelope[RunRunning]:
    bench = event.payload
    started = RunRunning(run_id=bench.plan.run_id, stage="gating")
    return _derived(event.follow(started, producer=PRODUCER), f"{bench.bench_id}/run.running/gating")


def gate_evaluated(
    event: Envelope[BenchCompleted], candidate_id: str, outcome: GateOutcome
) -> Envelope[GateEvaluated]:
    verdict = GateEvaluated(
        bench_id=event.payload.bench_id,
        candidate_id=candidate_id,
        method=outcome.method,
        passed=outcome.passed,
        score=outcome.score,
        threshold=outcome.threshold,
        details=outcome.details,
    )
    return event.follow(verdict, producer=PRODUCER)


def gate_unavailable(method: GateMethod, candidate: Candidate, error: BaseException) -> GateOutcome:
    """A failed verdict for a candidate the gate could not run on.

    It fails closed: a candidate whose output was not checked must not win. The
    predictor's scorer then disqualifies it as any failed gate (quality_regression);
    `details.error` tells this case apart from a measured regression.
    """
    return GateOutcome(
        method=method,
        passed=False,
        details={
            "candidate_id": candidate.candidate_id,
            "measured": False,
            "error": describe(error),
            "reason": "the gate could not run on this candidate, so it fails closed",
        },
    )


def exact_over_http(candidate: Candidate, agreement: float, threshold: float) -> GateOutcome:
    """The `exact` verdict of a candidate measured on an engine server (vLLM, SGLang, `specops
    serve engine`): the share of the bench's prompts whose greedy output on its server equals
    the baseline server's (Measurement.greedy_agreement, compared by the benchmark-runner
    while both servers ran)."""
    return GateOutcome(
        method=GateMethod.EXACT,
        passed=agreement >= threshold,
        score=agreement,
        threshold=threshold,
        details=_over_http(
            candidate,
            "greedy outputs of the candidate's engine server against the baseline server's, "
            "prompt by prompt, on the bench's prompts",
        ),
    )


def topk5_over_http(candidate: Candidate, evidence: Top5Evidence, threshold: float) -> GateOutcome:
    """The `topk5` verdict of a candidate measured on a vLLM server, on what its bench scored
    (Measurement.top5): its tokens inside the target's top 5 over the number the target's own
    sampling puts there in expectation, as the in-process method scores."""
    score = evidence.inside_top5 / evidence.expected_inside_top5 if evidence.expected_inside_top5 else 1.0
    return GateOutcome(
        method=GateMethod.TOPK5,
        passed=score >= threshold,
        score=score,
        threshold=threshold,
        details=_over_http(
            candidate,
            "the candidate server's outputs, read teacher-forced by the baseline server",
            prompts=evidence.prompts,
            tokens=evidence.tokens,
            outside_top5=evidence.tokens - evidence.inside_top5,
            share_inside_top5=evidence.inside_top5 / evidence.tokens if evidence.tokens else 1.0,
            target_expected_share=evidence.expected_inside_top5 / evidence.tokens if evidence.tokens else 1.0,
            worst_prompt_share=evidence.worst_prompt_share,
        ),
    )


def judged_over_http(candidate: Candidate, outcome: GateOutcome, reason: str) -> GateOutcome:
    """An outcome its method computed from evidence a bench gathered on engine servers
    (mmlu_slice: Measurement.mmlu, constraint_violation: Measurement.structured), marked so."""
    return outcome.model_copy(update={"details": _over_http(candidate, reason, **outcome.details)})


def _over_http(candidate: Candidate, reason: str, **evidence: JsonValue) -> dict[str, JsonValue]:
    """The details of a verdict on evidence a bench gathered on engine servers."""
    return {
        "candidate_id": candidate.candidate_id,
        "measured": True,
        "measured_over": "http",
        **evidence,
        "reason": reason,
    }


def target_unavailable(event: Envelope[BenchCompleted], message: str) -> Envelope[RunFailed]:
    bench = event.payload
    failed = RunFailed(
        run_id=bench.plan.run_id,
        error_stage=ErrorStage.QUALITY_GATE,
        message=f"the quality gate could not load the target: {message}",
    )
    return _derived(event.follow(failed, producer=PRODUCER), f"{bench.bench_id}/run.failed")


def describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _derived(envelope: Envelope[P], key: str) -> Envelope[P]:
    return envelope.model_copy(update={"event_id": str(uuid.uuid5(EVENT_NAMESPACE, key))})


# --- T3 heads ---------------------------------------------------------------------------------
# One verdict per trained artifact: head.gated and head.failed carry ids derived from the head
# and its artifact's digest, and that id is claimed in the inbox with the verdict, so a
# redelivered (or re-sent) head.trained never publishes a second, different verdict.


def head_verdict_id(trained: HeadTrained) -> str:
    """The id of the one verdict (head.gated or head.failed) on this head's artifact."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{trained.head_id}/{trained.artifact.sha256}/verdict"))


def head_gated(event: Envelope[HeadTrained], result: HeadGateResult) -> Envelope[HeadGated]:
    trained = event.payload
    gated = HeadGated(head_id=trained.head_id, artifact=trained.artifact, result=result)
    return event.follow(gated, producer=PRODUCER).model_copy(update={"event_id": head_verdict_id(trained)})


def head_failed(event: Envelope[HeadTrained], stage: ErrorStage, message: str) -> Envelope[HeadFailed]:
    trained = event.payload
    failed = HeadFailed(head_id=trained.head_id, error_stage=stage, message=message)
    return event.follow(failed, producer=PRODUCER).model_copy(update={"event_id": head_verdict_id(trained)})
