"""Parking a message a service gave up on, verbatim, on `spec.dlq.<service>`, as a DeadLetter."""

from __future__ import annotations

import base64
import logging

from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import propagate
from pydantic import Base64Bytes, Field

from specbus.publish import MSG_ID, publish_raw
from specbus.subjects import dlq_subject
from specbus.wire import Model, UtcDatetime, utc_now

log = logging.getLogger(__name__)


class DeadLetter(Model):
    """A failed message kept verbatim: it may not parse, so it is not wrapped in an Envelope."""

    service: str = Field(description="Service that gave up.")
    subject: str = Field(description="Subject the message was delivered on.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Its NATS headers (Nats-Msg-Id included)."
    )
    data: Base64Bytes = Field(
        description="Its body, base64-encoded; empty when it was too large to keep here (`omitted_bytes`)."
    )
    omitted_bytes: int | None = Field(
        None,
        ge=1,
        description="The body's size when it was left out: a letter must fit in one NATS message, "
        "so a body over KEPT_BYTES stays only in its stream, at `stream`/`stream_sequence`.",
    )
    stream: str | None = Field(None, description="The stream holding the original message.")
    deliveries: int = Field(ge=1, description="Delivery attempts made before parking.")
    error: str = Field(description="The last error, e.g. a validation message or exception text.")
    stream_sequence: int | None = Field(
        None, ge=1, description="Sequence in its stream (SPEC, or SPEC_INTAKE for an intake request)."
    )
    parked_at: UtcDatetime = Field(default_factory=utc_now, description="When it was parked, UTC.")


# The largest body a letter carries itself: base64 makes it 4/3 larger, and the letter
# with its headers must stay under NATS's 1 MiB message limit, or parking fails and the
# message comes back forever.
KEPT_BYTES = 512 * 1024


def dead_letter(service: str, msg: Msg, *, error: str, deliveries: int) -> DeadLetter:
    """The DLQ record of a delivered JetStream message; its body is kept even if it is not
    JSON, unless it is over KEPT_BYTES: then the letter points at it in its stream."""
    kept = len(msg.data) <= KEPT_BYTES
    return DeadLetter.model_validate(
        {
            "service": service,
            "subject": msg.subject,
            "headers": dict(msg.headers or {}),
            "data": base64.b64encode(msg.data if kept else b"").decode(),
            "omitted_bytes": None if kept else len(msg.data),
            "stream": msg.metadata.stream,
            "deliveries": deliveries,
            "error": error,
            "stream_sequence": msg.metadata.sequence.stream,
        }
    )


async def park(
    target: NatsBroker | JetStreamContext, service: str, msg: Msg, *, error: str, deliveries: int
) -> DeadLetter:
    """Publish the message's dead letter and wait for the PubAck; raises if NATS did not store it.

    The caller terminates the original only after this returns, so a message is
    never both unparked and dropped.
    """
    letter = dead_letter(service, msg, error=error, deliveries=deliveries)
    # Keyed on the stream and sequence: parking the same message again (the term was
    # lost and it came back) is dropped by the broker's dedup window.
    origin = f"{letter.stream}-{letter.stream_sequence}"
    headers = {MSG_ID: f"dlq-{service}-{origin}", "content-type": "application/json"}
    propagate.inject(headers)
    await publish_raw(target, dlq_subject(service), letter.model_dump_json().encode(), headers)
    log.error(
        "parked %s (stream seq %s) on %s after %d deliveries: %s",
        msg.subject,
        letter.stream_sequence,
        dlq_subject(service),
        deliveries,
        error,
    )
    return letter
