"""A service's handler on its durable pull consumer: typed events, retries with backoff, DLQ.

FastStream's default ack policy terminates a failed message; here the bus owns the
acknowledgement (`AckPolicy.MANUAL`) so that every delivery ends in exactly one of:
ack (handled), nak with a backoff delay (retry), or park on `spec.dlq.<service>` then
term (malformed, or failed `max_deliver` times). Nothing is dropped silently.

Only failures of the message's own count toward `max_deliver`. A failure of the
infrastructure (Postgres or NATS unreachable, see `specbus.faults`) is retried within the
same delivery, kept alive by heartbeats, with a capped backoff and without limit: an
outage of any length delays a message but never parks it.

`subscriber` takes events (`spec.<aggregate>.*.<event>`); `dead_letter_subscriber`
takes the dead letters themselves (`spec.dlq.>`); `raw_subscriber` takes messages as
they are on the wire, undecoded, for a handler that must keep what does not parse
(the audit). All three under the same rules; a `RetryPolicy` with `max_deliver=None`
never parks and retries with its backoff for as long as the handler fails.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig

from specbus import tracing
from specbus.broker import SpecBroker, inbox_prefix
from specbus.dlq import DeadLetter, park
from specbus.envelope import Envelope, EventPayload, decode_event
from specbus.faults import is_transient
from specbus.metrics import record_delivery
from specbus.publish import MSG_ID, publish
from specbus.subjects import DLQ_SUBJECTS, STREAM, STREAM_SUBJECTS, pattern
from specbus.tasks import cancel_until_done

log = logging.getLogger(__name__)

P = TypeVar("P", bound=EventPayload)
M = TypeVar("M")
Reply: TypeAlias = Envelope[Any] | Sequence[Envelope[Any]] | None
Handler: TypeAlias = Callable[[Envelope[P]], Awaitable[Reply]]
LetterHandler: TypeAlias = Callable[[DeadLetter], Awaitable[Reply]]

_CONSUMER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Messages a durable consumer has handed out and not yet seen settled, over all its
# replicas: those in a handler and those waiting out a retry backoff (a nak'd message stays
# pending). At the limit the server delivers nothing more until some settle. A transient
# failure holds its worker instead of naking, so what accumulates here are permanent
# failures, each parked within its policy's backoff (about 2.6 minutes by default): room
# for a burst of them to wait without stalling the messages behind them.
MAX_ACK_PENDING = 1_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failing handler is retried before its message is parked."""

    max_deliver: int | None = 5
    """Handler attempts per message; after the last failure it goes to the DLQ.

    None: never parked, retried with the backoff until the handler succeeds (a sink
    whose own dead letters would come back to it, see services/audit)."""
    backoff_s: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0)
    """Delay before attempt n+1 after failure n; the last value repeats."""
    ack_wait_s: float = 30.0
    """Redelivery delay if a process dies mid-handler; a running handler extends it by heartbeats."""
    transient_backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    """Delay before trying again after a transient failure n (`specbus.faults`); the last value
    repeats, without limit: these retries happen within the delivery and never count toward
    `max_deliver`."""

    def __post_init__(self) -> None:
        if self.max_deliver is not None and self.max_deliver < 1:
            raise ValueError(f"max_deliver must be >= 1, got {self.max_deliver}")
        backoffs = {"backoff_s": self.backoff_s, "transient_backoff_s": self.transient_backoff_s}
        for name, backoff in backoffs.items():
            if not backoff or min(backoff) < 0:
                raise ValueError(f"{name} must be non-empty and non-negative, got {backoff}")
        if self.ack_wait_s <= 0:
            raise ValueError(f"ack_wait_s must be positive, got {self.ack_wait_s}")

    def delay(self, failures: int) -> float:
        return self.backoff_s[min(failures, len(self.backoff_s)) - 1]

    def transient_delay(self, failures: int) -> float:
        return self.transient_backoff_s[min(failures, len(self.transient_backoff_s)) - 1]

    def exhausted(self, deliveries: int) -> bool:
        """Whether the `deliveries`-th delivery is the last the handler gets."""
        return self.max_deliver is not None and deliveries >= self.max_deliver


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A delivered message as it is on the wire, for a handler that takes anything (`raw_subscriber`)."""

    subject: str
    data: bytes
    stream_sequence: int
    """Its sequence in the SPEC stream."""
    headers: Mapping[str, str]


RawHandler: TypeAlias = Callable[[RawMessage], Awaitable[Reply]]


class Unprocessable(ValueError):
    """Raised by a handler for a message that no retry can fix (it is parked at once).

    The handler has done whatever answering it does (e.g. told the publisher why, through
    the outbox) before raising; the bus then parks the message and terminates it.
    """


def consumer_name(service: str, handler: str) -> str:
    """Durable consumer name: replicas of one service share it and so split the work."""
    name = f"{service}-{handler}"
    if not _CONSUMER_NAME.fullmatch(name):
        raise ValueError(f"invalid consumer name {name!r}: must match {_CONSUMER_NAME.pattern}")
    return name


def filter_subjects(events: Sequence[type[EventPayload]]) -> list[str]:
    """`spec.<aggregate>.*.<event>` for each event type, e.g. `spec.run.*.requested`."""
    return [pattern(*cls.event_type.split(".", 1)) for cls in events]


def subscriber(
    broker: NatsBroker,
    *,
    service: str,
    events: type[P] | Sequence[type[P]],
    name: str | None = None,
    retry: RetryPolicy = RetryPolicy(),
    max_workers: int = 1,
    fetch_timeout_s: float = 5.0,
) -> Callable[[Handler[P]], Handler[P]]:
    """Register `handler(event) -> next events` on the durable consumer `<service>-<name>`.

    The handler gets a validated `Envelope` of one of `events` and may return events to
    publish before the message is acked (handlers that write Postgres return nothing
    and use the outbox instead, see `specbus.inbox.process_once`). The handler itself
    is returned unchanged, so it stays a plain coroutine function to unit-test.
    """
    accepted = (events,) if isinstance(events, type) else tuple(events)
    if not accepted:
        raise ValueError("subscriber needs at least one event type")
    subjects = filter_subjects(accepted)

    def register(handler: Handler[P]) -> Handler[P]:
        durable = consumer_name(service, name or handler.__name__)
        delivery = _Delivery(broker, service, durable, "event", _event_decoder(accepted), handler, retry)
        _bind(broker, durable, subjects, delivery, handler.__doc__, max_workers, fetch_timeout_s)
        return handler

    return register


def dead_letter_subscriber(
    broker: NatsBroker,
    *,
    service: str,
    name: str = "dead_letter",
    retry: RetryPolicy = RetryPolicy(),
    max_workers: int = 1,
    fetch_timeout_s: float = 5.0,
) -> Callable[[LetterHandler], LetterHandler]:
    """Register `handler(letter) -> next events` on `<service>-<name>`, over every service's dead letters.

    The handler gets a validated `DeadLetter` (`spec.dlq.>`; the body it keeps is not
    decoded, since it may not parse) and is delivered as `subscriber`'s handlers are:
    retried with backoff, then parked on `spec.dlq.<service>`. What this handler gives up
    on therefore comes back to it once, as the body of a letter of its own, so it must
    acknowledge a letter whose body is not an event rather than fail on it.
    """

    def register(handler: LetterHandler) -> LetterHandler:
        durable = consumer_name(service, name)
        delivery = _Delivery(broker, service, durable, "dead letter", _decode_letter, handler, retry)
        _bind(broker, durable, [DLQ_SUBJECTS], delivery, handler.__doc__, max_workers, fetch_timeout_s)
        return handler

    return register


def raw_subscriber(
    broker: NatsBroker,
    *,
    service: str,
    name: str,
    subjects: str | Sequence[str] = STREAM_SUBJECTS,
    stream: str = STREAM,
    retry: RetryPolicy = RetryPolicy(),
    max_workers: int = 1,
    fetch_timeout_s: float = 5.0,
) -> Callable[[RawHandler], RawHandler]:
    """Register `handler(message) -> next events` on `<service>-<name>`, over `subjects` of
    `stream` undecoded.

    The handler gets every message as a `RawMessage` (events, dead letters, bodies that
    are not JSON), so none is malformed to the bus: a message is parked only after
    `retry.max_deliver` failed attempts, never under `max_deliver=None`, and at once when
    the handler raises `Unprocessable`. Messages are fetched one at a time, so with one
    worker the handler sees them in stream order (a message waiting out its backoff is
    overtaken by the ones behind it).
    """
    filters = [subjects] if isinstance(subjects, str) else list(subjects)
    if not filters:
        raise ValueError("raw_subscriber needs at least one subject")

    def register(handler: RawHandler) -> RawHandler:
        durable = consumer_name(service, name)
        delivery = _Delivery(broker, service, durable, "message", _raw, handler, retry)
        _bind(broker, durable, filters, delivery, handler.__doc__, max_workers, fetch_timeout_s, stream)
        return handler

    return register


def _event_decoder(accepted: tuple[type[EventPayload], ...]) -> Callable[[Msg], Envelope[Any]]:
    types = {cls.event_type: cls for cls in accepted}

    def decode(msg: Msg) -> Envelope[Any]:
        event = decode_event(msg.data, types)
        if event.subject != msg.subject:
            raise ValueError(f"event for {event.subject!r} was published on {msg.subject!r}")
        return event

    return decode


def _decode_letter(msg: Msg) -> DeadLetter:
    return DeadLetter.model_validate_json(msg.data)


def _raw(msg: Msg) -> RawMessage:
    return RawMessage(msg.subject, msg.data, msg.metadata.sequence.stream, dict(msg.headers or {}))


def _bind(
    broker: NatsBroker,
    durable: str,
    subjects: Sequence[str],
    delivery: _Delivery[Any],
    doc: str | None,
    max_workers: int,
    fetch_timeout_s: float,
    stream: str = STREAM,
) -> None:
    """Subscribe `delivery` on the durable pull consumer `durable` of `stream` filtered on `subjects`."""

    async def consume(message: NatsMessage) -> None:
        await delivery.handle(message.raw_message)

    consume.__name__ = consume.__qualname__ = durable
    consume.__doc__ = doc
    config = ConsumerConfig(
        name=durable,
        durable_name=durable,
        ack_wait=delivery.retry.ack_wait_s,
        # Unlimited on the server on purpose: the bus stops running the handler after
        # `retry.max_deliver` and parks the message itself. A server-side limit would
        # instead drop it with only an advisory when parking failed or the process
        # died during the last attempt.
        max_deliver=-1,
        max_ack_pending=MAX_ACK_PENDING,
        filter_subject=subjects[0] if len(subjects) == 1 else None,
        filter_subjects=list(subjects) if len(subjects) > 1 else None,
    )
    if isinstance(broker, SpecBroker):
        broker.declare_consumer(config, stream=stream)
    broker.subscriber(
        subjects[0] if len(subjects) == 1 else "",
        stream=JStream(stream, declare=False),
        durable=durable,
        config=config,
        pull_sub=PullSub(batch_size=1, timeout=fetch_timeout_s),
        # The pulled messages come back on the service's own inboxes, the only ones its
        # NATS user may read (FastStream would otherwise use the default `_INBOX.`).
        inbox_prefix=f"{inbox_prefix(delivery.service)}.".encode(),
        ack_policy=AckPolicy.MANUAL,
        max_workers=max_workers,
        no_reply=True,
        decoder=_undecoded,
    )(consume)


async def _undecoded(message: NatsMessage) -> Any:
    """FastStream's decoder, replaced: `_Delivery` decodes the raw message itself.

    FastStream's own json-decodes a body without a content type and lets a RecursionError
    (a body nested thousands deep) escape before the handler: the message was never
    settled and came back forever.
    """
    return message.body


@dataclass(frozen=True, slots=True)
class _Delivery(Generic[M]):
    """Decides the fate of one delivered message for one handler."""

    broker: NatsBroker
    service: str
    consumer: str
    """The durable consumer it is delivered on; its replicas share it."""
    kind: str
    """What the handler takes ("event", "dead letter", "message"), for the DLQ's error text."""
    decode: Callable[[Msg], M]
    """The delivered message -> what the handler takes; ValueError (or ValidationError) if malformed."""
    handler: Callable[[M], Awaitable[Reply]]
    retry: RetryPolicy

    async def handle(self, msg: Msg) -> None:
        """Settle one delivery, then log one INFO line of what happened to it.

        The line (prefixed with the process's service[replica] by `specops serve`) is how
        an operator sees which replica of a service handled which message.
        """
        started = time.monotonic()
        outcome = await self._settle_delivery(msg)
        seconds = time.monotonic() - started
        record_delivery(consumer=self.consumer, subject=msg.subject, verdict=outcome.verdict, seconds=seconds)
        log.info(
            "%s: %s delivery %d of %s: %s in %.3fs",
            self.consumer,
            msg.subject,
            msg.metadata.num_delivered,
            outcome.message_id,
            outcome.verdict,
            seconds,
        )

    async def _settle_delivery(self, msg: Msg) -> _Outcome:
        deliveries = msg.metadata.num_delivered
        unknown = _message_id(msg, None)
        if self.retry.max_deliver is not None and deliveries > self.retry.max_deliver:
            # Only permanent failures end a delivery (transient ones are retried within it),
            # and the last of them parks: this delivery means the previous attempts never
            # reported back (the process died, or overran ack_wait without a heartbeat).
            error = f"no attempt finished in {self.retry.max_deliver} deliveries"
            return _Outcome(unknown, await self._give_up(msg, error, deliveries))
        try:
            message = self.decode(msg)
        except ValueError as exc:
            # Retrying cannot fix a malformed message: park it at once.
            return _Outcome(unknown, await self._give_up(msg, f"malformed {self.kind}: {exc}", deliveries))
        message_id = _message_id(msg, message)

        async def attempt() -> None:
            with self._span(msg, message_id):
                reply = await self.handler(message)
                for follow in _as_events(reply):
                    await publish(self.broker, follow)

        try:
            await self._through_outages(msg, f"delivery {deliveries} of {message_id}", attempt)
        except Unprocessable as exc:
            return _Outcome(
                message_id, await self._give_up(msg, f"unprocessable {self.kind}: {exc}", deliveries)
            )
        except Exception as exc:
            if self.retry.exhausted(deliveries):
                log.exception("%s failed on delivery %d of %s", msg.subject, deliveries, message_id)
                return _Outcome(
                    message_id, await self._give_up(msg, f"{type(exc).__name__}: {exc}", deliveries)
                )
            delay = self.retry.delay(deliveries)
            log.warning("%s failed (delivery %d), retry in %.1fs: %r", msg.subject, deliveries, delay, exc)
            await _settle(msg.nak(delay=delay))
            return _Outcome(message_id, f"failed, retry in {delay:g}s")
        # A lost ack only means a redelivery, which the consumer's inbox absorbs.
        await _settle(msg.ack_sync())
        return _Outcome(message_id, "handled")

    async def _give_up(self, msg: Msg, error: str, deliveries: int) -> str:
        """Park the message and terminate it; what happened, for the delivery's log line."""

        async def park_it() -> None:
            await park(self.broker, self.service, msg, error=error, deliveries=deliveries)

        try:
            await self._through_outages(msg, "parking", park_it)
        except Exception:
            # Not parked, so not terminated either: it comes back and parking is retried.
            log.exception("could not park %s; it will be redelivered", msg.subject)
            delay = self.retry.delay(deliveries)
            await _settle(msg.nak(delay=delay))
            return f"not parked, retry in {delay:g}s"
        await _settle(msg.term())
        return "parked"

    async def _through_outages(self, msg: Msg, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """`step()`, run again after each transient failure (`specbus.faults`) for as long as it takes.

        The retries happen within this delivery, which the heartbeat keeps ours, so an
        outage of Postgres or NATS, however long, never uses up the message's deliveries;
        a permanent failure is raised for the caller to count. Stopping the process
        cancels the wait, and the message is redelivered after ack_wait.
        """
        failures = 0
        async with self._heartbeat(msg):
            while True:
                try:
                    await step()
                    return
                except Exception as exc:
                    if isinstance(exc, Unprocessable) or not is_transient(exc):
                        raise
                    failures += 1
                    delay = self.retry.transient_delay(failures)
                    log.warning(
                        "%s: %s %s failed on the infrastructure (%d in a row), retry in %.1fs: %r",
                        self.consumer,
                        msg.subject,
                        what,
                        failures,
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)

    def _span(self, msg: Msg, message_id: str) -> Any:
        return tracing.process_span(msg, consumer=self.consumer, message_id=message_id)

    @asynccontextmanager
    async def _heartbeat(self, msg: Msg) -> AsyncIterator[None]:
        """Tell JetStream the message is still being worked on, so long handlers keep it."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.retry.ack_wait_s / 3)
                with suppress(NatsError, OSError):
                    await msg.in_progress()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            await cancel_until_done([task])


@dataclass(frozen=True, slots=True)
class _Outcome:
    message_id: str
    verdict: str  # handled, failed (retry), parked, not parked


def _message_id(msg: Msg, message: object) -> str:
    """An event's id; for anything else its Nats-Msg-Id, else its stream sequence."""
    if isinstance(message, Envelope):
        return message.event_id
    return (msg.headers or {}).get(MSG_ID) or f"stream seq {msg.metadata.sequence.stream}"


def _as_events(reply: Reply) -> Sequence[Envelope[Any]]:
    if reply is None:
        return ()
    if isinstance(reply, Envelope):
        return (reply,)
    return reply


async def _settle(ack: Awaitable[Any]) -> None:
    # An ack/nak/term lost to a broken connection is not fatal: JetStream redelivers
    # after ack_wait and the next delivery decides again.
    try:
        await ack
    except (NatsError, OSError) as exc:
        log.warning("could not settle a message: %r", exc)
