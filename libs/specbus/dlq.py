"""Parking a message a service gave up on, verbatim, on `spec.dlq.<service>`."""

from __future__ import annotations

import base64
import logging

from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import propagate

from specbus.publish import MSG_ID, publish_raw
from specops_schemas.dlq import DeadLetter
from specops_schemas.subjects import dlq_subject

log = logging.getLogger(__name__)


def dead_letter(service: str, msg: Msg, *, error: str, deliveries: int) -> DeadLetter:
    """The DLQ record of a delivered JetStream message; its body is kept even if it is not JSON."""
    return DeadLetter.model_validate(
        {
            "service": service,
            "subject": msg.subject,
            "headers": dict(msg.headers or {}),
            "data": base64.b64encode(msg.data).decode(),
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
    # Keyed on the stream sequence: parking the same message again (the term was lost
    # and it came back) is dropped by the broker's dedup window.
    headers = {MSG_ID: f"dlq-{service}-{letter.stream_sequence}", "content-type": "application/json"}
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
