"""Parking a message a service gave up on, verbatim, on `spec.dlq.<service>`, as a DeadLetter;
the record of a letter redriven (`specops dlq redrive`), and how many are left (a gauge)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping

from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import propagate
from prometheus_client import Gauge
from pydantic import Base64Bytes, Field

from specbus.broker import jetstream
from specbus.publish import MSG_ID, publish_raw
from specbus.subjects import DLQ_SUBJECTS, REDRIVEN_SUBJECTS, STREAM, dlq_subject
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

    def brief_error(self, limit: int) -> str:
        """The last error, stripped and cut to at most `limit` characters (ending in "...")."""
        error = self.error.strip() or "no error text"
        return error if len(error) <= limit else error[: limit - 3] + "..."


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


# --- redrive -----------------------------------------------------------------------------------


class Redriven(Model):
    """The record that a dead letter was redriven (`spec.redriven.<service>.<letter seq>`)."""

    letter_seq: int = Field(ge=1, description="Stream sequence of the dead letter in SPEC.")
    service: str = Field(description="Service that had parked the message.")
    subject: str = Field(description="Subject the message was republished on (its original one).")
    msg_id: str = Field(description="Nats-Msg-Id of the republished message.")
    republished_seq: int = Field(ge=1, description="Stream sequence of the republished message.")
    redriven_at: UtcDatetime = Field(default_factory=utc_now, description="When, UTC.")


# Headers the broker reads on publish: the republished message gets its own dedup id, and
# the expected stream is set again by the publish itself.
_BROKER_HEADERS = frozenset({MSG_ID.lower(), "nats-expected-stream"})


def redrive_headers(letter: DeadLetter, msg_id: str) -> dict[str, str]:
    """The parked message's headers (trace context, CloudEvents attributes) under a fresh Nats-Msg-Id.

    The original id would be swallowed by the stream's dedup window if the message was
    parked less than its duration ago.
    """
    kept = {name: value for name, value in letter.headers.items() if name.lower() not in _BROKER_HEADERS}
    return kept | {MSG_ID: msg_id}


def depth_by_service(
    letters: Mapping[str, int], redriven: Mapping[str, int], *, first_seq: int
) -> dict[str, int]:
    """Letters not redriven, per service, from the stream's per-subject message counts.

    `letters`: counts of `spec.dlq.<service>`; `redriven`: of `spec.redriven.<service>.<seq>`
    (one subject per redriven letter, whatever the number of redrives). A record whose
    letter is older than the stream's first sequence (retired by max_age) counts for nothing.
    """
    depth = {subject.rsplit(".", 1)[-1]: count for subject, count in letters.items()}
    for subject in redriven:
        _, _, service, seq = subject.split(".")
        if int(seq) >= first_seq and service in depth:
            depth[service] -= 1
    return {service: max(count, 0) for service, count in depth.items()}


DEAD_LETTERS = Gauge("specops_dead_letters", "Dead letters on spec.dlq.<service> not redriven.", ["service"])
DEPTH_INTERVAL_S = 30.0


async def watch_depth(target: NatsBroker | JetStreamContext, *, interval_s: float = DEPTH_INTERVAL_S) -> None:
    """Keep DEAD_LETTERS current until cancelled: two stream-info calls per interval, no message read."""
    js = jetstream(target)
    while True:
        try:
            letters = await js.stream_info(STREAM, subjects_filter=DLQ_SUBJECTS)
            redriven = await js.stream_info(STREAM, subjects_filter=REDRIVEN_SUBJECTS)
            depth = depth_by_service(
                letters.state.subjects or {}, redriven.state.subjects or {}, first_seq=letters.state.first_seq
            )
            for service, count in depth.items():
                DEAD_LETTERS.labels(service).set(count)
        except Exception as exc:
            # NATS away: the gauge keeps its last value until the next look.
            log.warning("could not count dead letters: %r", exc)
        await asyncio.sleep(interval_s)
