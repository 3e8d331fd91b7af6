"""The bus's spans: `send <subject template>` around a publish, `process <subject template>`
around a handler, with the OpenTelemetry messaging attributes and W3C trace context in the
NATS headers.

A publish continues the trace context its headers already carry, not the one current when
it is sent: the outbox relay publishes later, from a task of its own, the headers that
`outbox.add` computed when the event was committed with the work that caused it. The
consumer's span is then a child of the send span, whose context the publish injects.
Without an OpenTelemetry SDK (tracing off) every span here is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from specbus.envelope import CLOUDEVENTS_ATTRIBUTES
from specbus.subjects import PREFIX, template

tracer = trace.get_tracer("specbus")

# The envelope's correlation id, as `envelope_headers` repeats it.
CORRELATION = f"ce-{CLOUDEVENTS_ATTRIBUTES['correlation_id']}"
# Aggregates of a run's flow: their events' correlation id is the run's id.
RUN_FLOW = ("run", "bench", "gate")


def messaging_attributes(
    subject: str, headers: Mapping[str, str], *, operation: str, message_id: str | None
) -> dict[str, AttributeValue]:
    """Messaging semantic-convention attributes of one message (`operation`: send, process),
    and the run it belongs to."""
    attributes: dict[str, AttributeValue] = {
        "messaging.system": "nats",
        "messaging.destination.name": template(subject),
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    correlation = headers.get(CORRELATION)
    if correlation:
        attributes["specops.correlation_id"] = correlation
        tokens = subject.split(".")
        if len(tokens) == 4 and tokens[0] == PREFIX and tokens[1] in RUN_FLOW:
            attributes["specops.run_id"] = correlation
    return attributes


@contextmanager
def send_span(
    subject: str, headers: Mapping[str, str], *, message_id: str | None
) -> Iterator[dict[str, str]]:
    """A PRODUCER span for publishing on `subject`, a child of the context `headers` carry;
    yields a copy of `headers` that carries the span's own context instead."""
    parent = propagate.extract(headers)
    with tracer.start_as_current_span(
        f"send {template(subject)}",
        context=parent,
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(subject, headers, operation="send", message_id=message_id),
    ):
        sent = dict(headers)
        propagate.inject(sent)
        yield sent


def process_span(msg: Msg, *, consumer: str, message_id: str) -> Any:
    """A CONSUMER span around handling one delivery, a child of its send span (headers)."""
    headers = msg.headers or {}
    attributes = messaging_attributes(msg.subject, headers, operation="process", message_id=message_id) | {
        "messaging.consumer.group.name": consumer,
        "specops.delivery": msg.metadata.num_delivered,
    }
    return tracer.start_as_current_span(
        f"process {template(msg.subject)}",
        context=propagate.extract(headers),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
