"""The bus against a real nats-server and PostgreSQL: dedup, inbox, retries, DLQ (and its
consumers), outbox, reconnect."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import nats
import pytest
from faststream.nats import NatsBroker
from fixtures.nats import NatsServer
from nats.aio.client import Client
from nats.js import JetStreamContext
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from specbus import (
    OutboxRelay,
    RawMessage,
    RetryPolicy,
    consumer_name,
    dead_letter_subscriber,
    envelope_headers,
    make_broker,
    outbox,
    process_once,
    publish,
    raw_subscriber,
    subscriber,
)
from specbus.broker import reconnect_delay
from specbus.consumer import MAX_ACK_PENDING
from specbus.dlq import KEPT_BYTES, DeadLetter
from specbus.envelope import Envelope, new_event
from specbus.publish import MSG_ID, publish_raw
from specbus.subjects import STREAM, dlq_subject
from specops_schemas.events import RunQueued, RunRunning, parse_event

# Short enough that the whole file runs in seconds; the defaults are minutes.
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=5.0)
FETCH_S = 0.5
WAIT_S = 10.0


def _service() -> str:
    return f"svc_{uuid.uuid4().hex[:8]}"


def _run_queued() -> Envelope[RunQueued]:
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    return new_event(RunQueued(run_id=run_id), tenant_id="acme", correlation_id=run_id, producer="tests")


async def _wait_for(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def _running(broker: NatsBroker) -> AsyncIterator[NatsBroker]:
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def _dead_letters(js: JetStreamContext, service: str, count: int) -> list[DeadLetter]:
    sub = await js.pull_subscribe(dlq_subject(service), stream=STREAM)
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(letters) < count and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(count - len(letters), timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            letters += [DeadLetter.model_validate_json(m.data) for m in msgs]
    finally:
        await sub.unsubscribe()
    return letters


async def _stored(js: JetStreamContext, subject: str) -> int:
    """How many messages the SPEC stream holds on `subject`."""
    info = await js.stream_info(STREAM, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


@pytest.fixture
async def nc(nats_server: NatsServer, nats_url: str) -> AsyncIterator[Client]:
    nats_server.ensure_running()
    client = await nats.connect(
        nats_url, max_reconnect_attempts=-1, reconnect_to_server_handler=reconnect_delay
    )
    yield client
    await client.close()


@pytest.fixture
async def js(nc: Client) -> JetStreamContext:
    js = nc.jetstream()
    # One stream for the session; each test starts from an empty one so that its
    # consumers (which deliver from the start) see only its own events.
    await js.purge_stream(STREAM)
    return js


@pytest.fixture
async def pool(db: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A pool on this test's own freshly migrated database."""
    async with await AsyncConnection.connect(db, autocommit=True) as conn:
        await conn.execute("CREATE TABLE bus_test_effects (consumer text, event_id uuid)")
    async with AsyncConnectionPool(db, min_size=1, max_size=4, open=False) as pool:
        yield pool


async def _count(pool: AsyncConnectionPool[Any], sql: str, *params: object) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql, params)).fetchone()
    return int(row[0]) if row else 0


async def test_an_event_published_twice_is_processed_once(
    nats_url: str, js: JetStreamContext, pool: AsyncConnectionPool[Any]
) -> None:
    service = _service()
    consumer = consumer_name(service, "record")
    broker = make_broker(nats_url, service=service)
    outcomes: list[bool] = []

    @subscriber(broker, service=service, events=RunQueued, name="record", retry=FAST, fetch_timeout_s=FETCH_S)
    async def record(event: Envelope[RunQueued]) -> None:
        async def work(conn: AsyncConnection[Any]) -> None:
            insert = "INSERT INTO bus_test_effects (consumer, event_id) VALUES (%s, %s)"
            await conn.execute(insert, (consumer, event.event_id))

        outcomes.append(await process_once(pool, consumer, event, work))

    event = _run_queued()
    async with _running(broker):
        first = await publish(js, event)
        within_window = await publish(js, event)
        # A re-publish the broker cannot recognise (after the dedup window, or from a
        # different producer instance): stored and delivered again, stopped by the inbox.
        late = await publish_raw(
            js, event.subject, event.to_json_bytes(), envelope_headers(event) | {MSG_ID: "re-published"}
        )
        await _wait_for(lambda: len(outcomes) == 2)
        await asyncio.sleep(0.3)

    assert [bool(ack.duplicate) for ack in (first, within_window, late)] == [False, True, False]
    assert outcomes == [True, False]
    effects = "SELECT count(*) FROM bus_test_effects WHERE consumer = %s AND event_id = %s"
    assert await _count(pool, effects, consumer, event.event_id) == 1


async def test_malformed_messages_are_parked_and_the_next_good_one_is_processed(
    nats_url: str, js: JetStreamContext
) -> None:
    service = _service()
    broker = make_broker(nats_url, service=service)
    handled: list[str] = []

    @subscriber(broker, service=service, events=RunQueued, retry=FAST, fetch_timeout_s=FETCH_S)
    async def on_queued(event: Envelope[RunQueued]) -> None:
        handled.append(event.event_id)

    good = _run_queued()
    fields = good.model_dump(mode="json")
    oversized = json.dumps(fields | {"padding": "x" * 900_000}).encode()
    bad_bodies = {
        b"{not json": "not JSON",
        json.dumps({k: v for k, v in fields.items() if k != "tenant_id"}).encode(): "tenant_id",
        json.dumps(fields | {"type": "run.exploded"}).encode(): "unknown event type",
        json.dumps(fields | {"schema_version": RunQueued.schema_version + 1}).encode(): "is newer",
        b"[" * 5000: "nested too deeply",
        oversized: "padding",
    }

    async with _running(broker):
        for i, body in enumerate(bad_bodies):
            await publish_raw(js, good.subject, body, {MSG_ID: f"bad-{i}-{good.event_id}"})
        await publish(js, good)
        await _wait_for(lambda: handled == [good.event_id])
        letters = await _dead_letters(js, service, len(bad_bodies))
        # One worker takes them in order: each bad one was settled before the good one.
        info = await js.consumer_info(STREAM, consumer_name(service, "on_queued"))

    # Each parked once, none left to come back.
    assert await _stored(js, dlq_subject(service)) == len(bad_bodies)
    assert info.num_ack_pending == 0 and info.num_redelivered == 0
    assert info.delivered.consumer_seq == len(bad_bodies) + 1
    # A body too large to travel in its letter stays in its stream, which the letter names.
    kept = [body if len(body) <= KEPT_BYTES else b"" for body in bad_bodies]
    assert [letter.data for letter in letters] == kept
    assert [letter.omitted_bytes for letter in letters] == [None] * 5 + [len(oversized)]
    for letter, reason in zip(letters, bad_bodies.values(), strict=True):
        assert letter.error.startswith("malformed event") and reason in letter.error
        assert (letter.service, letter.subject, letter.deliveries) == (service, good.subject, 1)
        assert letter.stream == STREAM and letter.stream_sequence is not None
    original = await js.get_msg(STREAM, letters[-1].stream_sequence)
    assert original.data == oversized


async def test_a_failing_handler_is_retried_with_backoff_then_parked(
    nats_url: str, js: JetStreamContext
) -> None:
    service = _service()
    broker = make_broker(nats_url, service=service)
    doomed, flaky = _run_queued(), _run_queued()
    attempts: dict[str, list[float]] = {doomed.event_id: [], flaky.event_id: []}

    @subscriber(broker, service=service, events=RunQueued, retry=FAST, fetch_timeout_s=FETCH_S)
    async def on_queued(event: Envelope[RunQueued]) -> None:
        attempts[event.event_id].append(time.monotonic())
        if event.event_id == doomed.event_id or len(attempts[event.event_id]) == 1:
            raise RuntimeError("boom")

    async with _running(broker):
        await publish(js, doomed)
        await publish(js, flaky)
        letters = await _dead_letters(js, service, 1)
        await asyncio.sleep(1.0)  # no attempt after parking

    tries = attempts[doomed.event_id]
    assert len(tries) == FAST.max_deliver
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.9 * FAST.backoff_s[0] and gaps[1] >= 0.9 * FAST.backoff_s[1]
    assert len(attempts[flaky.event_id]) == 2  # failed once, then succeeded and was acked

    [letter] = letters
    assert (letter.deliveries, letter.error) == (FAST.max_deliver, "RuntimeError: boom")
    assert parse_event(letter.data).event_id == doomed.event_id
    assert letter.headers[MSG_ID] == doomed.event_id


async def test_a_raw_subscriber_takes_any_body_and_retries_forever_without_parking(
    nats_url: str, js: JetStreamContext
) -> None:
    service = _service()
    broker = make_broker(nats_url, service=service)
    forever = RetryPolicy(max_deliver=None, backoff_s=(0.1, 0.2), ack_wait_s=5.0)
    failures = 2 * FAST.max_deliver  # a bounded policy would have parked it long before
    event = _run_queued()
    junk = b"{not json"
    seen: dict[bytes, list[tuple[float, RawMessage]]] = {junk: [], event.to_json_bytes(): []}

    @raw_subscriber(
        broker, service=service, name="sink", subjects=event.subject, retry=forever, fetch_timeout_s=FETCH_S
    )
    async def sink(message: RawMessage) -> None:
        seen[message.data].append((time.monotonic(), message))
        if message.data == junk and len(seen[junk]) <= failures:
            raise RuntimeError("database down")

    async with _running(broker):
        stored = await publish_raw(js, event.subject, junk, {MSG_ID: f"junk-{service}"})
        await publish(js, event)
        await _wait_for(lambda: len(seen[junk]) == failures + 1 and len(seen[event.to_json_bytes()]) == 1)
        await asyncio.sleep(1.0)  # acked: no delivery more
        info = await js.consumer_info(STREAM, consumer_name(service, "sink"))

    tries = seen[junk]
    assert len(tries) == failures + 1 and len(seen[event.to_json_bytes()]) == 1
    gaps = [b[0] - a[0] for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.9 * forever.backoff_s[0] and min(gaps[1:]) >= 0.9 * forever.backoff_s[1]
    message = tries[-1][1]
    assert (message.subject, message.stream_sequence) == (event.subject, stored.seq)
    assert message.headers[MSG_ID] == f"junk-{service}"
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert await _stored(js, dlq_subject(service)) == 0


async def test_outbox_relay_publishes_a_row_committed_while_nats_was_down_exactly_once(
    nats_server: NatsServer, nats_url: str, js: JetStreamContext, pool: AsyncConnectionPool[Any]
) -> None:
    broker = make_broker(nats_url, service=_service())
    relay = OutboxRelay(pool, broker, poll_interval_s=0.1, max_backoff_s=0.3, publish_timeout_s=0.5)
    event = _run_queued()
    published = "SELECT count(*) FROM outbox WHERE id = %s AND published_at IS NOT NULL"

    async with _running(broker):
        nats_server.stop()
        try:
            async with pool.connection() as conn, conn.transaction():
                await outbox.add(conn, event)
            await relay.start()
            await asyncio.sleep(1.0)  # the relay keeps failing while NATS is away
            assert await _count(pool, published, event.event_id) == 0
        finally:
            nats_server.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while await _count(pool, published, event.event_id) == 0:
                assert time.monotonic() < deadline, "the relay did not publish after NATS came back"
                await asyncio.sleep(0.05)
        finally:
            await relay.stop()

    assert await _stored(js, event.subject) == 1
    stored = await js.get_last_msg(STREAM, event.subject)
    assert stored.data == event.to_json_bytes()
    assert stored.headers is not None and stored.headers[MSG_ID] == event.event_id
    # NATS was away: an outage, not the row's fault, so nothing was counted against it.
    blamed = "SELECT count(*) FROM outbox WHERE id = %s AND attempts = 0 AND quarantined_at IS NULL"
    assert await _count(pool, blamed, event.event_id) == 1


async def test_outbox_resend_after_a_crash_before_marking_is_deduplicated(
    js: JetStreamContext, pool: AsyncConnectionPool[Any]
) -> None:
    event = _run_queued()
    async with pool.connection() as conn, conn.transaction():
        await outbox.add(conn, event)
        await outbox.add(conn, event)  # adding twice is harmless too
    # A relay published the row and died before marking it; the next relay sends it again.
    await publish(js, event)
    relay = OutboxRelay(pool, js)
    while await relay.publish_pending():
        pass
    assert await _stored(js, event.subject) == 1
    pending = "SELECT count(*) FROM outbox WHERE id = %s AND published_at IS NULL"
    assert await _count(pool, pending, event.event_id) == 0


async def test_a_relay_publishes_only_its_own_services_events(
    js: JetStreamContext, pool: AsyncConnectionPool[Any]
) -> None:
    ours, theirs = _run_queued(), _run_queued().model_copy(update={"producer": "predictor"})
    async with pool.connection() as conn, conn.transaction():
        await outbox.add(conn, ours)
        await outbox.add(conn, theirs)
    # The tests' relay: its NATS user could not publish the predictor's subjects anyway.
    relay = OutboxRelay(pool, js, producer="tests")
    while await relay.publish_pending():
        pass
    assert await _stored(js, ours.subject) == 1
    assert await _stored(js, theirs.subject) == 0
    await OutboxRelay(pool, js, producer="predictor").publish_pending()
    assert await _stored(js, theirs.subject) == 1


async def test_the_relay_purges_rows_published_before_the_retention(
    js: JetStreamContext, pool: AsyncConnectionPool[Any]
) -> None:
    old, recent, unpublished = _run_queued(), _run_queued(), _run_queued()
    async with pool.connection() as conn, conn.transaction():
        for event in (old, recent):
            await outbox.add(conn, event)
    relay = OutboxRelay(pool, js, retention_s=3_600.0, poll_interval_s=0.1, purge_every_s=0.1)
    while await relay.publish_pending():
        pass
    async with pool.connection() as conn, conn.transaction():
        await outbox.add(conn, unpublished)
        await conn.execute(
            "UPDATE outbox SET published_at = now() - interval '2 hours' WHERE id = %s", (old.event_id,)
        )
        await conn.execute(
            "UPDATE outbox SET created_at = now() - interval '2 days' WHERE id = %s", (unpublished.event_id,)
        )
    assert await relay.purge_published() == 1
    kept = "SELECT count(*) FROM outbox WHERE id = %s"
    assert await _count(pool, kept, old.event_id) == 0
    assert await _count(pool, kept, recent.event_id) == 1
    # Never published: kept whatever its age.
    assert await _count(pool, kept, unpublished.event_id) == 1
    assert await _stored(js, old.subject) == 1  # the stream still has the purged row's event


async def test_a_consumer_keeps_consuming_after_nats_restarts(
    nats_server: NatsServer, nats_url: str, nc: Client, js: JetStreamContext
) -> None:
    service = _service()
    broker = make_broker(nats_url, service=service)
    handled: list[str] = []

    @subscriber(broker, service=service, events=RunQueued, retry=FAST, fetch_timeout_s=FETCH_S)
    async def on_queued(event: Envelope[RunQueued]) -> None:
        handled.append(event.event_id)

    before, after = _run_queued(), _run_queued()
    async with _running(broker):
        await publish(js, before)
        await _wait_for(lambda: handled == [before.event_id])
        reconnects = nc.stats["reconnects"]
        nats_server.restart()
        # A request in flight when the server went away is lost, so the publisher
        # waits for its own reconnect (the consumer's reconnect is what is under test).
        await _wait_for(lambda: nc.stats["reconnects"] > reconnects)
        await publish(js, after)
        await _wait_for(lambda: handled == [before.event_id, after.event_id])


async def test_one_handler_takes_several_event_types_and_config_changes_reach_the_server(
    nats_url: str, js: JetStreamContext
) -> None:
    service = _service()
    handled: list[str] = []

    async def on_run(event: Envelope[RunQueued | RunRunning]) -> None:
        handled.append(event.type)

    first = make_broker(nats_url, service=service)
    subscriber(first, service=service, events=RunQueued, name="on_run", fetch_timeout_s=FETCH_S)(on_run)
    async with _running(first):
        pass

    # Redeployed: the handler now also takes run.running, with a longer ack_wait.
    second = make_broker(nats_url, service=service)
    subscriber(
        second,
        service=service,
        events=[RunQueued, RunRunning],
        name="on_run",
        retry=RetryPolicy(ack_wait_s=7.0),
        fetch_timeout_s=FETCH_S,
    )(on_run)
    queued = _run_queued()
    running = queued.follow(RunRunning(run_id=queued.payload.run_id, stage="predicting"), producer="tests")
    async with _running(second):
        await publish(js, queued)
        await publish(js, running)
        await _wait_for(lambda: len(handled) == 2)
        info = await js.consumer_info(STREAM, consumer_name(service, "on_run"))

    assert handled == ["run.queued", "run.running"]
    assert info.config.ack_wait == 7.0
    assert info.config.max_ack_pending == MAX_ACK_PENDING
    assert sorted(info.config.filter_subjects or []) == ["spec.run.*.queued", "spec.run.*.running"]


async def test_a_dead_letter_handler_gets_every_services_letters_and_its_own_once(
    nats_url: str, js: JetStreamContext
) -> None:
    failing, service = _service(), _service()
    parking = make_broker(nats_url, service=failing)
    broker = make_broker(nats_url, service=service)
    letters: list[DeadLetter] = []

    @subscriber(parking, service=failing, events=RunQueued, retry=FAST, fetch_timeout_s=FETCH_S)
    async def on_queued(event: Envelope[RunQueued]) -> None:
        raise RuntimeError("boom")

    @dead_letter_subscriber(broker, service=service, retry=FAST, fetch_timeout_s=FETCH_S)
    async def on_letter(letter: DeadLetter) -> None:
        letters.append(letter)

    doomed = _run_queued()
    async with _running(parking), _running(broker):
        await publish(js, doomed)
        await _wait_for(lambda: len(letters) == 1)
        # Not a dead letter on a dead-letter subject: this handler parks it as malformed,
        # then gets that letter of its own once, as any other.
        await publish_raw(js, dlq_subject("elsewhere"), b"{not a letter", {MSG_ID: f"junk-{service}"})
        await _wait_for(lambda: len(letters) == 2)
        await asyncio.sleep(1.0)  # and nothing more

    first, own = letters
    assert (first.service, first.error) == (failing, "RuntimeError: boom")
    assert parse_event(first.data).event_id == doomed.event_id
    assert (own.service, own.subject, own.data) == (service, dlq_subject("elsewhere"), b"{not a letter")
    assert own.error.startswith("malformed dead letter")
    assert await _stored(js, dlq_subject(service)) == 1
