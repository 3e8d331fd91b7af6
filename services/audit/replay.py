"""Re-read the SPEC stream from a point in time or a sequence, with a throwaway consumer.

The stream (limits retention, a year's max age) is the event log; the audit table is
its hash-chained copy. Replay reads the stream itself, so it also shows events the
audit service has not recorded yet. An ephemeral pull consumer without acks leaves
no trace: nothing is acknowledged and the consumer is deleted afterwards (and would
expire on its own after `INACTIVE_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy
from nats.js.errors import NotFoundError

from specbus.subjects import STREAM, STREAM_SUBJECTS
from specops_services.audit.logic import entry_from_message

CONNECT_TIMEOUT_S = 3.0
FETCH_TIMEOUT_S = 5.0
BATCH = 256
INACTIVE_S = 60.0


class ReplayError(Exception):
    """Replay could not run (no server, no stream, bad subject); the message is one line."""


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """Exactly one of `since` (stream time) or `seq` (stream sequence, from 1)."""

    since: datetime | None = None
    seq: int | None = None

    def __post_init__(self) -> None:
        if (self.since is None) == (self.seq is None):
            raise ValueError("give exactly one of since or seq")
        if self.seq is not None and self.seq < 1:
            raise ValueError(f"stream sequences start at 1, got {self.seq}")
        if self.since is not None and self.since.tzinfo is None:
            raise ValueError("since must be timezone-aware")


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One message of the SPEC stream as stored: what the audit recorded, or should have."""

    seq: int
    time: datetime
    subject: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ReplayedEvent:
    seq: int
    time: datetime
    subject: str
    type: str
    event_id: str
    tenant_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time.isoformat(),
            "subject": self.subject,
            "type": self.type,
            "event_id": self.event_id,
            "tenant_id": self.tenant_id,
        }

    def line(self) -> str:
        return f"{self.seq}  {self.time.isoformat()}  {self.subject}  {self.type}  {self.event_id}"


def consumer_config(start: ReplayStart, subject: str | None) -> ConsumerConfig:
    by_seq = start.seq is not None
    return ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if by_seq else DeliverPolicy.BY_START_TIME,
        opt_start_seq=start.seq,
        opt_start_time=start.since,
        filter_subject=subject or STREAM_SUBJECTS,
        ack_policy=AckPolicy.NONE,
        replay_policy=ReplayPolicy.INSTANT,
        inactive_threshold=INACTIVE_S,
        mem_storage=True,
    )


async def connect(url: str, credentials: Mapping[str, str] | None = None) -> Client:
    """A connection that fails fast: a CLI should say 'no server' rather than retry forever.

    `credentials`: nats.connect options (Settings.nats_credentials()) of a user that may
    read the stream (the runtime's admin).
    """

    async def quiet(_: Exception) -> None:
        # The failure is reported once, as ReplayError; nats-py would log every attempt.
        return None

    try:
        return await asyncio.wait_for(
            nats.connect(
                url,
                connect_timeout=CONNECT_TIMEOUT_S,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                allow_reconnect=False,
                error_cb=quiet,
                **(credentials or {}),
            ),
            timeout=3 * CONNECT_TIMEOUT_S,
        )
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise ReplayError(f"cannot connect to NATS at {url}: {exc or type(exc).__name__}") from None


async def replay(nc: Client, start: ReplayStart, subject: str | None = None) -> AsyncIterator[ReplayedEvent]:
    """Every message of SPEC from `start` (matching `subject`) up to the stream's end when called."""
    async for message in messages(nc, start, subject):
        entry = entry_from_message(message.subject, message.data)
        yield ReplayedEvent(
            message.seq, message.time, message.subject, entry.type, entry.event_id, entry.tenant_id
        )


async def messages(
    nc: Client, start: ReplayStart, subject: str | None = None
) -> AsyncIterator[StreamMessage]:
    """The messages of SPEC from `start` (matching `subject`), in stream order, up to its end when called."""
    js = nc.jetstream()
    try:
        last_seq = (await js.stream_info(STREAM)).state.last_seq
        consumer = await js.add_consumer(STREAM, consumer_config(start, subject))
    except NotFoundError:
        raise ReplayError(f"JetStream stream {STREAM} does not exist on this server") from None
    except nats.js.errors.APIError as exc:
        raise ReplayError(f"JetStream refused the replay consumer: {exc.description or exc}") from None
    except nats.errors.Error as exc:
        raise ReplayError(f"JetStream did not answer (is it enabled on this server?): {exc}") from None
    try:
        sub = await js.pull_subscribe_bind(consumer=consumer.name, stream=STREAM)
        pending = consumer.num_pending or 0
        while pending > 0:
            try:
                msgs = await sub.fetch(batch=min(BATCH, pending), timeout=FETCH_TIMEOUT_S)
            except nats.errors.TimeoutError:
                raise ReplayError(f"no message from the stream within {FETCH_TIMEOUT_S:g} s") from None
            except nats.errors.Error as exc:
                raise ReplayError(f"replay interrupted: {exc}") from None
            for msg in msgs:
                meta = msg.metadata
                yield StreamMessage(meta.sequence.stream, meta.timestamp, msg.subject, msg.data)
                pending = meta.num_pending
                # Events published while replaying are past the end asked for.
                if meta.sequence.stream >= last_seq:
                    pending = 0
                    break
        await sub.unsubscribe()
    finally:
        with contextlib.suppress(nats.errors.Error):
            await js.delete_consumer(STREAM, consumer.name)  # else it expires after INACTIVE_S


async def message_at(nc: Client, seq: int) -> StreamMessage | None:
    """The stream's message at sequence `seq`; None when the stream holds none there (any more)."""
    try:
        msg = await nc.jetstream().get_msg(STREAM, seq=seq)
    except NotFoundError:
        return None
    except nats.js.errors.APIError as exc:
        raise ReplayError(f"JetStream refused message {seq}: {exc.description or exc}") from None
    except nats.errors.Error as exc:
        raise ReplayError(f"JetStream did not answer for message {seq}: {exc}") from None
    if msg.seq is None or msg.subject is None or msg.time is None:
        return None
    return StreamMessage(msg.seq, msg.time, msg.subject, msg.data or b"")
