"""Faults of the infrastructure against a real nats-server and PostgreSQL: an outage of the
database longer than a message's retry budget, an outbox row NATS will never take, and
streams at their size limit."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import nats
import pytest
from fixtures import bus
from fixtures.postgres import OwnPostgres
from nats.js import JetStreamContext
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from specbus import (
    OutboxRelay,
    RetryPolicy,
    consumer_name,
    make_broker,
    outbox,
    process_once,
    publish,
    subscriber,
)
from specbus.broker import MAX_AGE_S, MAX_BYTES, UPSTREAM_MAX_BYTES
from specbus.envelope import Envelope, new_event
from specbus.faults import is_transient
from specbus.subjects import INTAKE_STREAM, STREAM, dlq_subject
from specops.runtime.stream import apply_stream_config
from specops_schemas.events import RunQueued
from specplatform.db import create_pool
from specplatform.errors import RuntimeSetupError

# The budget of a failure of the message's own: three deliveries, less than a second of
# backoff. The outage below lasts twice as many attempts.
POLICY = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=3.0, transient_backoff_s=(0.2, 0.5))
FETCH_S = 0.5
WAIT_S = 60.0


def _run_queued() -> Envelope[RunQueued]:
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    return new_event(RunQueued(run_id=run_id), tenant_id="acme", correlation_id=run_id, producer="tests")


async def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {WAIT_S}s")
        await asyncio.sleep(0.05)


async def _sql(dsn: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall() if cursor.description else []


async def test_a_postgres_outage_longer_than_the_retry_budget_delays_a_message_and_never_parks_it(
    nats_url: str, js: JetStreamContext, own_postgres: OwnPostgres
) -> None:
    service = f"outage_{uuid.uuid4().hex[:8]}"
    consumer = consumer_name(service, "record")
    await _sql(own_postgres.url, "CREATE TABLE effects (event_id uuid)")
    # A short pool timeout, so that each attempt during the outage fails within a second.
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        own_postgres.url, min_size=1, max_size=2, timeout=1.0, open=False
    )
    broker = make_broker(nats_url, service=service)
    failures: list[Exception] = []

    @subscriber(
        broker, service=service, events=RunQueued, name="record", retry=POLICY, fetch_timeout_s=FETCH_S
    )
    async def record(event: Envelope[RunQueued]) -> None:
        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute("INSERT INTO effects (event_id) VALUES (%s)", (event.event_id,))

        try:
            await process_once(pool, consumer, event, work)
        except Exception as exc:
            failures.append(exc)
            raise

    event = _run_queued()
    await pool.open(wait=True)
    try:
        await broker.start()
        try:
            await asyncio.to_thread(own_postgres.stop)
            try:
                ack = await publish(js, event)
                # Down for twice the attempts a failure of the message's own would get.
                await _wait_for(lambda: len(failures) >= 2 * (POLICY.max_deliver or 0))
            finally:
                await asyncio.to_thread(own_postgres.start)
            await bus.acked(js, consumer, ack, wait_s=WAIT_S)
            info = await js.consumer_info(STREAM, consumer)
        finally:
            await broker.stop()
    finally:
        await pool.close()

    assert all(is_transient(exc) for exc in failures), failures
    effects = await _sql(own_postgres.url, "SELECT event_id FROM effects")
    assert [str(row[0]) for row in effects] == [event.event_id]  # committed exactly once
    assert info.delivered.consumer_seq == 1  # one delivery, retried within it
    assert await bus.count(js, dlq_subject(service)) == 0


async def test_an_outbox_row_nats_refuses_is_quarantined_and_the_rows_behind_it_are_published(
    js: JetStreamContext, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    before, doomed, after = _run_queued(), _run_queued(), _run_queued()
    pool = create_pool(db, max_size=2)  # dict rows, as the services' pools
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn, conn.transaction():
            await outbox.add(conn, before)
            # Over NATS's 1 MiB message limit: refused (MaxPayloadError) however often it is sent.
            await outbox.add_message(
                conn,
                message_id=doomed.event_id,
                subject=doomed.subject,
                body=doomed.to_json_bytes() + b" " * (2 * 1024 * 1024),
                headers={},
                producer="tests",
            )
            await outbox.add(conn, after)
        relay = OutboxRelay(pool, js, poll_interval_s=0.05, max_backoff_s=0.2, max_attempts=3)
        with caplog.at_level(logging.ERROR, logger="specbus.outbox"):
            await relay.start()
            try:
                for event in (before, after):
                    await bus.events(js, event.subject, wait_s=WAIT_S)
            finally:
                await relay.stop()
    finally:
        await pool.close()

    rows = await _sql(
        db,
        "SELECT id, attempts, last_error, quarantined_at IS NOT NULL, published_at IS NOT NULL "
        "FROM outbox ORDER BY seq",
    )
    assert [(str(id_), published) for id_, *_, published in rows] == [
        (before.event_id, True),
        (doomed.event_id, False),
        (after.event_id, True),
    ]
    _, attempts, last_error, quarantined, _ = rows[1]
    assert (attempts, quarantined) == (3, True)
    assert last_error.startswith("MaxPayloadError")
    assert await bus.count(js, doomed.subject) == 0
    [logged] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert doomed.event_id in logged.getMessage() and doomed.subject in logged.getMessage()


async def test_the_streams_limits_are_set_from_the_environment_and_discard_the_oldest(
    own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await apply_stream_config(own_nats_url)
    nc = await nats.connect(own_nats_url)
    try:
        js = nc.jetstream()
        spec, intake = await js.stream_info(STREAM), await js.stream_info(INTAKE_STREAM)
        assert (spec.config.max_bytes, spec.config.max_age) == (MAX_BYTES, MAX_AGE_S)
        assert intake.config.max_bytes == UPSTREAM_MAX_BYTES

        # Changed settings reach the stream that exists, events and all.
        events = [_run_queued() for _ in range(20)]
        await publish(js, events[0])
        monkeypatch.setenv("SPECOPS_STREAM_MAX_BYTES", "8192")
        monkeypatch.setenv("SPECOPS_STREAM_MAX_AGE_DAYS", "30")
        await apply_stream_config(own_nats_url)
        spec = await js.stream_info(STREAM)
        assert (spec.config.max_bytes, spec.config.max_age) == (8192, 30 * 86_400.0)
        # At the limit a publish still succeeds: the oldest events make room.
        for event in events[1:]:
            await publish(js, event)
        state = (await js.stream_info(STREAM)).state
        assert state.bytes <= 8192 and 0 < state.messages < len(events)
        assert state.last_seq == len(events) and state.first_seq > 1

        # Limits the server cannot reserve: an error that says which setting to lower.
        monkeypatch.setenv("SPECOPS_STREAM_MAX_BYTES", str(2**60))
        with pytest.raises(RuntimeSetupError, match="SPECOPS_STREAM_MAX_BYTES"):
            await apply_stream_config(own_nats_url)
    finally:
        await nc.close()
