"""Dead letters read straight from the SPEC stream, and redriven (`specops dlq`).

A letter (`spec.dlq.<service>`, `specbus.dlq.DeadLetter`) keeps the message a service
gave up on, or names it in its stream when it was too large to keep. Redriving it
republishes that message, body and headers, on its original subject under a fresh
Nats-Msg-Id, then records the redrive on `spec.redriven.<service>.<letter seq>` (the
stream denies deletes, so a letter cannot be removed; `ls` reads the records back and a
second redrive is refused unless forced). The republished message goes to the same
consumers as the original did: one whose error has been fixed since takes it now.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import nats
from nats.aio.client import Client
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from specbus.dlq import DeadLetter, Redriven, redrive_headers
from specbus.publish import MSG_ID, publish_raw
from specbus.subjects import (
    DLQ,
    DLQ_SUBJECTS,
    PREFIX,
    REDRIVEN_SUBJECTS,
    STREAM,
    dlq_subject,
    redriven_subject,
)
from speccore.errors import SpecError
from specops_services.audit.replay import ReplayError, ReplayStart, StreamMessage, message_at, messages


class DlqError(SpecError):
    """A letter that cannot be read or redriven; printed as one line."""


@dataclass(frozen=True, slots=True)
class ParkedLetter:
    """A dead letter at its stream sequence, with the record of its last redrive if any."""

    seq: int
    time: datetime
    letter: DeadLetter
    redriven: Redriven | None


async def letters(nc: Client, service: str | None = None) -> list[ParkedLetter]:
    """Every dead letter in the stream (of `service`), oldest first."""
    subject = DLQ_SUBJECTS if service is None else dlq_subject(service)
    records = {r.letter_seq: r async for r in _redrives(nc)}
    found = []
    async for message in _read(nc, subject):
        letter = _letter(message.seq, message.data)
        found.append(ParkedLetter(message.seq, message.time, letter, records.get(message.seq)))
    return found


async def letter_at(nc: Client, seq: int) -> ParkedLetter:
    """The dead letter at stream sequence `seq`; DlqError when there is none there."""
    try:
        message = await message_at(nc, seq)
    except ReplayError as exc:
        raise DlqError(str(exc)) from None
    if message is None:
        raise DlqError(f"no message at sequence {seq} of {STREAM} (never written, or retired by its max age)")
    if not message.subject.startswith(f"{PREFIX}.{DLQ}."):
        raise DlqError(f"sequence {seq} is not a dead letter but {message.subject}; see `specops dlq ls`")
    letter = _letter(seq, message.data)
    records = [r async for r in _redrives(nc, redriven_subject(letter.service, seq))]
    return ParkedLetter(seq, message.time, letter, records[-1] if records else None)


async def redrive(nc: Client, seq: int, *, force: bool = False) -> Redriven:
    """Republish the letter's message on its original subject and record that it was.

    Refused (DlqError) when it was redriven before, unless `force`.
    """
    parked = await letter_at(nc, seq)
    letter = parked.letter
    if parked.redriven is not None and not force:
        raise DlqError(
            f"letter {seq} was redriven at {parked.redriven.redriven_at:%Y-%m-%d %H:%M:%S}Z "
            f"(republished as sequence {parked.redriven.republished_seq}); add --force to redrive it again"
        )
    body = await _original_body(nc, letter)
    msg_id = f"redrive-{seq}-{uuid.uuid4().hex}"
    js = nc.jetstream()
    try:
        ack = await publish_raw(js, letter.subject, body, redrive_headers(letter, msg_id))
        record = Redriven(
            letter_seq=seq,
            service=letter.service,
            subject=letter.subject,
            msg_id=msg_id,
            republished_seq=ack.seq,
        )
        subject = redriven_subject(letter.service, seq)
        await publish_raw(js, subject, record.model_dump_json().encode(), {MSG_ID: f"redriven-{msg_id}"})
    except nats.errors.Error as exc:
        raise DlqError(
            f"could not republish letter {seq} on {letter.subject}: {exc or type(exc).__name__}"
        ) from None
    return record


async def _original_body(nc: Client, letter: DeadLetter) -> bytes:
    """The parked body: kept in the letter, or read from its stream when it was too large."""
    if letter.omitted_bytes is None:
        return bytes(letter.data)
    if letter.stream is None or letter.stream_sequence is None:
        raise DlqError("the letter kept neither the body nor where it is; it cannot be redriven")
    try:
        original = await nc.jetstream().get_msg(letter.stream, seq=letter.stream_sequence)
    except NotFoundError:
        raise DlqError(
            f"the parked body ({letter.omitted_bytes} bytes) is no longer in {letter.stream} at "
            f"sequence {letter.stream_sequence}: retired by its max age"
        ) from None
    return original.data or b""


def _letter(seq: int, data: bytes) -> DeadLetter:
    try:
        return DeadLetter.model_validate_json(data)
    except ValidationError as exc:
        raise DlqError(f"the message at sequence {seq} is not a readable dead letter: {exc}") from None


async def _redrives(nc: Client, subject: str = REDRIVEN_SUBJECTS) -> AsyncIterator[Redriven]:
    async for message in _read(nc, subject):
        try:
            yield Redriven.model_validate_json(message.data)
        except ValidationError:
            continue  # a record this code cannot read redrove nothing it knows of


async def _read(nc: Client, subject: str) -> AsyncIterator[StreamMessage]:
    try:
        async for message in messages(nc, ReplayStart(seq=1), subject):
            yield message
    except ReplayError as exc:
        raise DlqError(str(exc)) from None
