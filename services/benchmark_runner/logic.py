"""The events the benchmark-runner publishes for a `bench.requested`, built without I/O.

Per bench: one `bench.rep_measured` per (method, rep), then `bench.completed`; or
`run.failed` when the bench cannot run at all (the target does not load, the baseline
fails). Their ids are derived from the bench (uuid5), so an event queued again by a
redelivered or re-published request is a no-op in the outbox, dropped by the broker's
dedup and by the consumers' inboxes.
"""

from __future__ import annotations

import uuid
from typing import TypeVar

from specbus.envelope import Envelope, EventPayload
from specops_schemas.events import BenchCompleted, BenchRepMeasured, BenchRequested, RunFailed
from specops_services.benchmark_runner.protocol import BenchOutcome, MeasureError, RepRow

PRODUCER = "benchmark-runner"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (BenchRepMeasured, BenchCompleted, RunFailed)
# uuid5 namespace of the event ids this service derives (any fixed UUID would do).
EVENT_NAMESPACE = uuid.UUID("0c4f7b52-3e8d-4a61-9b27-d5e1f08a6c39")

P = TypeVar("P", bound=EventPayload)


def rep_measured(event: Envelope[BenchRequested], row: RepRow) -> Envelope[BenchRepMeasured]:
    bench = event.payload
    measured = BenchRepMeasured(
        bench_id=bench.bench_id,
        candidate_id=row.candidate_id,
        rep=row.rep,
        reps=bench.plan.reps,
        metrics=row.metrics,
        speedup=row.speedup,
    )
    return _derived(event, measured, f"rep/{row.candidate_id}/{row.rep}")


def completed(event: Envelope[BenchRequested], outcome: BenchOutcome) -> Envelope[BenchCompleted]:
    bench = event.payload
    done = BenchCompleted(
        bench_id=bench.bench_id,
        plan=bench.plan,
        baseline=outcome.baseline,
        results=outcome.results,
        failures=outcome.failures,
    )
    return _derived(event, done, "completed")


def failed(event: Envelope[BenchRequested], error: MeasureError) -> Envelope[RunFailed]:
    """The run's end when its bench cannot be measured; the stage says where (e.g. model_load)."""
    message = error.message.strip() or type(error).__name__
    stop = RunFailed(run_id=event.payload.plan.run_id, error_stage=error.error_stage, message=message)
    return _derived(event, stop, "run.failed")


def finished(
    event: Envelope[BenchRequested], result: BenchOutcome | MeasureError
) -> Envelope[BenchCompleted] | Envelope[RunFailed]:
    """The bench's last event: its summary, or the run's failure when it could not be measured."""
    return failed(event, result) if isinstance(result, MeasureError) else completed(event, result)


def _derived(event: Envelope[BenchRequested], payload: P, key: str) -> Envelope[P]:
    follow = event.follow(payload, producer=PRODUCER)
    event_id = uuid.uuid5(EVENT_NAMESPACE, f"{event.payload.bench_id}/{key}")
    return follow.model_copy(update={"event_id": str(event_id)})
