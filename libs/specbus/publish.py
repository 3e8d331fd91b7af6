"""How an event goes on the wire: canonical JSON body, dedup / CloudEvents / trace headers, PubAck."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from nats.js.api import PubAck
from opentelemetry import propagate

from specbus.broker import jetstream
from specbus.envelope import CLOUDEVENTS_ATTRIBUTES, CLOUDEVENTS_SPEC_VERSION, Envelope
from specbus.subjects import stream_of
from specbus.tracing import send_span

MSG_ID = "Nats-Msg-Id"
PUBLISH_TIMEOUT_S = 5.0


def envelope_headers(envelope: Envelope[Any]) -> dict[str, str]:
    """Headers of an event: broker dedup id, CloudEvents attributes, current trace context.

    The body stays the whole envelope (its canonical JSON); the `ce-*` headers repeat
    its attributes so routers and tracing tools can read them without parsing the body.
    """
    attributes = envelope.model_dump(mode="json", exclude={"payload"})
    headers = {
        MSG_ID: envelope.event_id,
        "content-type": "application/json",
        "ce-specversion": CLOUDEVENTS_SPEC_VERSION,
        "ce-subject": envelope.subject,
    }
    for field, attribute in CLOUDEVENTS_ATTRIBUTES.items():
        if attributes[field] is not None:
            headers[f"ce-{attribute}"] = str(attributes[field])
    # W3C traceparent/tracestate of the work that causes the event (the send span's parent,
    # whenever it is sent); a no-op without an OTel SDK.
    propagate.inject(headers)
    return headers


async def publish_raw(
    target: NatsBroker | JetStreamContext,
    subject: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout: float = PUBLISH_TIMEOUT_S,
) -> PubAck:
    """JetStream publish into the subject's stream (`stream_of`) in a `send` span, a child of
    the trace context `headers` carry; returns once the stream has stored it (or it was a
    duplicate)."""
    # `sent` is a copy, which nats-py may add its expected-stream header to.
    with send_span(subject, headers, message_id=headers.get(MSG_ID)) as sent:
        return await jetstream(target).publish(
            subject, body, timeout=timeout, stream=stream_of(subject), headers=sent
        )


async def publish(
    target: NatsBroker | JetStreamContext, envelope: Envelope[Any], *, timeout: float = PUBLISH_TIMEOUT_S
) -> PubAck:
    """Publish one event on its subject with `Nats-Msg-Id = event_id` and wait for the PubAck.

    Publishing the same event again within the stream's duplicate window stores
    nothing (`PubAck.duplicate` is true); later, consumers' inboxes drop it.
    """
    return await publish_raw(
        target, envelope.subject, envelope.to_json_bytes(), envelope_headers(envelope), timeout=timeout
    )
