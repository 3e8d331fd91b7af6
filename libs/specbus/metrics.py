"""The bus's Prometheus instruments, in the default registry (served on `/metrics` by
`specplatform.ops`): what each durable consumer did with its deliveries, how long its handler
took, and how far the outbox is behind.

Labels stay few: `consumer` is the durable consumer (`<service>-<handler>`), `subject` the
subject's template (`spec.run.*.requested`, `specbus.subjects.template`), never an id.
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import Counter, Gauge, Histogram

from specbus.subjects import template

_LABELS = ("consumer", "subject")

CONSUMED = Counter(
    "specops_bus_messages_consumed",
    "Deliveries a handler handled, then acked (a redelivery counts again).",
    _LABELS,
)
FAILED = Counter(
    "specops_bus_messages_failed",
    "Deliveries that ended in a retry: the handler failed, or its message could not be parked.",
    _LABELS,
)
PARKED = Counter(
    "specops_bus_messages_parked",
    "Messages parked on the dead-letter subject spec.dlq.<service> and terminated.",
    _LABELS,
)
HANDLER_SECONDS = Histogram(
    "specops_bus_handler_duration_seconds",
    "Time from a delivery to its ack, nak or park: the handler, its publishes and the settling.",
    _LABELS,
    # Handlers range from a projector's insert (ms) to a benchmark's generations (minutes).
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
)
OUTBOX_PENDING = Gauge(
    "specops_outbox_pending_rows",
    "Outbox rows committed but not yet published, as the relay last counted them.",
    ("producer",),
)
OUTBOX_OLDEST_AGE = Gauge(
    "specops_outbox_oldest_pending_age_seconds",
    "Age of the oldest unpublished outbox row (0 when none), as the relay last measured it.",
    ("producer",),
)


class Verdict(Enum):
    """What became of one delivery, for the counters."""

    CONSUMED = "consumed"
    FAILED = "failed"
    PARKED = "parked"


def classify(verdict: str) -> Verdict:
    """The delivery's log verdict (`handled`, `parked`, `failed, retry in 5s`, `not parked, ...`)
    as a counter. A verdict this does not know counts as failed: its message comes back, so
    it is not lost from the counts, only counted as one more attempt."""
    if verdict.startswith("handled"):
        return Verdict.CONSUMED
    if verdict.startswith("parked"):
        return Verdict.PARKED
    return Verdict.FAILED


_COUNTERS = {Verdict.CONSUMED: CONSUMED, Verdict.FAILED: FAILED, Verdict.PARKED: PARKED}


def record_delivery(*, consumer: str, subject: str, verdict: str, seconds: float) -> None:
    """Count one settled delivery of `subject` on `consumer` and observe its duration."""
    labels = (consumer, template(subject))
    _COUNTERS[classify(verdict)].labels(*labels).inc()
    HANDLER_SECONDS.labels(*labels).observe(seconds)


def record_outbox_lag(*, producer: str | None, pending: int, oldest_age_s: float) -> None:
    """The relay's last count of its unpublished rows (`producer` None: every producer's)."""
    label = producer or "all"
    OUTBOX_PENDING.labels(label).set(pending)
    OUTBOX_OLDEST_AGE.labels(label).set(oldest_age_s)
