"""Transactional outbox: events committed with the state that caused them, published by a relay.

A service that writes Postgres and publishes must not publish directly: a crash between
its commit and its publish would lose the event, and a publish before the commit could
announce state that was rolled back. `add` writes the event in the caller's transaction;
`OutboxRelay` publishes committed rows with `Nats-Msg-Id = event_id` and marks them, so a
re-send after a crash between publish and mark is dropped by the broker's dedup window.
Published rows are deleted once they are older than `retention_s` (far beyond that
window): the `SPEC` stream keeps the events, the table only keeps what is in flight.

A row NATS refuses while the relay is connected (too large, a subject no stream takes
or the service may not publish: `specbus.faults`) is counted against it; after
`max_attempts` it is quarantined, kept but no longer published, and the rows behind it
go on. An outage (NATS unreachable, a timeout) only stops the pass: no row is blamed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import psycopg
from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from specbus.broker import jetstream
from specbus.envelope import Envelope
from specbus.faults import is_transient, publish_denied
from specbus.metrics import record_outbox_lag
from specbus.publish import MSG_ID, PUBLISH_TIMEOUT_S, envelope_headers, publish_raw
from specbus.tasks import cancel_until_done

log = logging.getLogger(__name__)

CHANNEL = "outbox"  # pg_notify channel of the trigger in schemas/sql/002_bus.sql

_INSERT = """
    INSERT INTO outbox (id, subject, body, headers, producer) VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (id) DO NOTHING
"""
# SKIP LOCKED lets several relay replicas drain the table side by side without
# publishing the same row twice at the same time. A relay publishes its own service's
# rows (and rows older than the producer column); one without a producer, all rows.
_PENDING = """
    SELECT id, subject, body, headers FROM outbox
    WHERE published_at IS NULL AND quarantined_at IS NULL
      AND (%(producer)s::text IS NULL OR producer IS NULL OR producer = %(producer)s)
    ORDER BY seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
"""
# What is left to publish, for the lag gauges; the partial index keeps it to the pending rows.
_LAG = """
    SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM outbox
    WHERE published_at IS NULL AND quarantined_at IS NULL
        AND (%(producer)s::text IS NULL OR producer IS NULL OR producer = %(producer)s)
"""
_MARK = "UPDATE outbox SET published_at = now() WHERE id = ANY(%s)"
_REFUSED = """
    UPDATE outbox SET attempts = attempts + 1, last_error = %(error)s,
        quarantined_at = CASE WHEN attempts + 1 >= %(max_attempts)s THEN now() END
    WHERE id = %(id)s
    RETURNING quarantined_at IS NOT NULL
"""
_PURGE = "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => %s)"
# A published row is kept a day, far beyond the broker's dedup window (DUPLICATE_WINDOW_S).
RETENTION_S = 86_400.0
PURGE_EVERY_S = 3_600.0
# The lag is measured after every pass, also while publishing fails; an unreachable database
# must not hold the relay's next attempt for a whole pool timeout.
LAG_TIMEOUT_S = 1.0
# Refusals of one row before it is quarantined: with the relay's backoff between passes
# (1, 2, 4, 8 s by default) a refusal that was really a passing hiccup has time to clear.
MAX_ATTEMPTS = 5


async def add(conn: AsyncConnection[Any], envelope: Envelope[Any]) -> None:
    """Queue an event for publishing when the caller's transaction commits.

    Headers are computed now, so the trace context is that of the work which caused
    the event. Adding the same event twice is a no-op.
    """
    await add_message(
        conn,
        message_id=envelope.event_id,
        subject=envelope.subject,
        body=envelope.to_json_bytes(),
        headers=envelope_headers(envelope),
        producer=envelope.producer,
    )


async def add_message(
    conn: AsyncConnection[Any],
    *,
    message_id: str,
    subject: str,
    body: bytes,
    headers: Mapping[str, str],
    producer: str,
) -> None:
    """Queue any message (e.g. a copy of an event on a tenant's result subject) like `add`.

    `message_id` is its id in the outbox and its `Nats-Msg-Id`, replacing the header's.
    """
    wire = dict(headers) | {MSG_ID: message_id}
    await conn.execute(_INSERT, (message_id, subject, body, Jsonb(wire), producer))


class OutboxRelay:
    """Publishes committed outbox rows; safe to run in every replica of a service."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        target: NatsBroker | JetStreamContext,
        *,
        batch_size: int = 100,
        poll_interval_s: float = 1.0,
        max_backoff_s: float = 10.0,
        publish_timeout_s: float = PUBLISH_TIMEOUT_S,
        listen_conninfo: str | None = None,
        retention_s: float = RETENTION_S,
        purge_every_s: float = PURGE_EVERY_S,
        producer: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if batch_size < 1 or poll_interval_s <= 0 or max_attempts < 1:
            raise ValueError("batch_size and max_attempts must be >= 1 and poll_interval_s > 0")
        self.pool = pool
        self.target = target
        self.batch_size = batch_size
        self.poll_interval_s = poll_interval_s
        self.max_backoff_s = max_backoff_s
        self.publish_timeout_s = publish_timeout_s
        self.retention_s = retention_s
        self.purge_every_s = purge_every_s
        self.producer = producer
        self.max_attempts = max_attempts
        # LISTEN needs a connection of its own, outside the pool.
        self.listen_conninfo = listen_conninfo or (pool.conninfo if isinstance(pool.conninfo, str) else None)
        self._listener: AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run the relay in the background (e.g. `app.after_startup(relay.start)`)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="outbox-relay")

    async def stop(self) -> None:
        """Stop the background relay; unpublished rows wait for the next one to start."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_until_done([task])

    async def publish_pending(self) -> int:
        """One pass over at most `batch_size` rows; returns how many were published.

        The pass stops at the first failure, which is raised, unless it was the last
        refusal a row gets: then that row is quarantined and the pass goes on. Rows
        published before a failure are still marked (and committed) first, so they are
        not sent again.
        """
        published: list[UUID] = []
        failure: Exception | None = None
        async with self.pool.connection() as conn, conn.transaction():
            # Tuple rows whatever row factory the pool was configured with.
            async with conn.cursor(row_factory=tuple_row) as cursor:
                params = {"producer": self.producer, "limit": self.batch_size}
                rows = await (await cursor.execute(_PENDING, params)).fetchall()
            for event_id, subject, body, headers in rows:
                try:
                    await publish_raw(
                        self.target, subject, bytes(body), headers, timeout=self.publish_timeout_s
                    )
                except Exception as exc:
                    if self._outage(subject, exc) or not await self._refused(conn, event_id, subject, exc):
                        # Retried after the relay's backoff, still ahead of the rows behind it.
                        failure = exc
                        break
                    continue
                published.append(event_id)
            if published:
                await conn.execute(_MARK, (published,))
        if failure is not None:
            raise failure
        return len(published)

    def _outage(self, subject: str, exc: Exception) -> bool:
        """Whether a failed publish on `subject` is NATS's fault rather than the row's."""
        # nats-py keeps the client on the JetStream context only as a private attribute.
        connection = jetstream(self.target)._nc
        if not connection.is_connected:
            return True
        if publish_denied(subject, connection.last_error):
            return False
        return is_transient(exc)

    async def _refused(
        self, conn: AsyncConnection[Any], event_id: UUID, subject: str, exc: Exception
    ) -> bool:
        """Count a refusal of the row; True if that quarantined it."""
        error = f"{type(exc).__name__}: {exc}"
        params = {"id": event_id, "error": error, "max_attempts": self.max_attempts}
        async with conn.cursor(row_factory=tuple_row) as cursor:
            row = await (await cursor.execute(_REFUSED, params)).fetchone()
        quarantined = bool(row and row[0])
        if quarantined:
            log.error(
                "outbox relay: quarantined row %s on %s after %d refusals, the rows behind it go on: %s",
                event_id,
                subject,
                self.max_attempts,
                error,
            )
        else:
            log.warning("outbox relay: NATS refused row %s on %s: %s", event_id, subject, error)
        return quarantined

    async def purge_published(self) -> int:
        """Delete rows published more than `retention_s` ago; returns how many."""
        async with self.pool.connection() as conn:
            cursor = await conn.execute(_PURGE, (self.retention_s,))
            return cursor.rowcount

    async def measure_lag(self) -> None:
        """Set the outbox gauges (`specbus.metrics`) from the rows still to publish; when the
        database cannot say, they keep their last values."""
        try:
            async with (
                self.pool.connection(timeout=LAG_TIMEOUT_S) as conn,
                conn.cursor(row_factory=tuple_row) as cursor,
            ):
                await cursor.execute(_LAG, {"producer": self.producer})
                row = await cursor.fetchone()
        except psycopg.Error:
            return
        if row is not None:
            record_outbox_lag(producer=self.producer, pending=int(row[0]), oldest_age_s=float(row[1]))

    async def run(self) -> None:
        """Publish forever: drain, then sleep until NOTIFY or the poll interval. Cancel to stop.

        Old published rows are purged at start and every `purge_every_s` after."""
        failures = 0
        loop = asyncio.get_running_loop()
        next_purge = loop.time()
        try:
            while True:
                try:
                    while await self.publish_pending() == self.batch_size:
                        pass
                    if loop.time() >= next_purge:
                        purged = await self.purge_published()
                        next_purge = loop.time() + self.purge_every_s
                        if purged:
                            log.info("outbox relay: purged %d published rows", purged)
                except Exception as exc:
                    # Whatever broke (NATS, Postgres, a bad row), the relay must outlive it.
                    failures += 1
                    delay = min(self.max_backoff_s, self.poll_interval_s * 2 ** (failures - 1))
                    log.warning("outbox relay: publish failed, retry in %.1fs: %r", delay, exc)
                    await self.measure_lag()
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                await self.measure_lag()
                await self._wait()
        finally:
            await self._close_listener()

    async def _wait(self) -> None:
        listener = await self._listen()
        if listener is None:
            await asyncio.sleep(self.poll_interval_s)
            return
        try:
            async for _ in listener.notifies(timeout=self.poll_interval_s, stop_after=1):
                pass
        except psycopg.Error as exc:
            log.warning("outbox relay: LISTEN connection lost, polling until it is back: %r", exc)
            await self._close_listener()

    async def _listen(self) -> AsyncConnection[Any] | None:
        if self._listener is None and self.listen_conninfo is not None:
            try:
                self._listener = await AsyncConnection.connect(self.listen_conninfo, autocommit=True)
                await self._listener.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error as exc:
                log.warning("outbox relay: cannot LISTEN, polling instead: %r", exc)
                await self._close_listener()
        return self._listener

    async def _close_listener(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()
