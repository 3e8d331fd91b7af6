"""What the benchmark-runner's handler does around the measuring: read what is stored,
measure in a worker thread while storing each rep row, then finish the bench.

Each rep row is stored in bench_results and its event queued in the outbox in one
transaction, as soon as its rep is measured (:func:`store_rep`). The bench's last event
(`bench.completed` or `run.failed`) is queued under `specbus.process_once`, so a
redelivered request changes nothing once it is finished. Each transaction acts for the
bench's tenant: a bench's rows are bound by row-level security through the run or tune
session they measure (schemas/sql/022_rls_children.sql).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from specbus import outbox, process_once
from specbus.envelope import Envelope
from specops_schemas.events import BenchRequested
from specops_services.benchmark_runner import db, logic, projection
from specops_services.benchmark_runner.protocol import BenchOutcome, MeasureError, RepRow
from specops_services.benchmark_runner.runner import BenchRunner
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """The handler was cancelled (shutdown): the measuring thread stops at its next rep."""


async def stored_reps(pool: Pool, inbox: str, event: Envelope[BenchRequested]) -> list[RepRow] | None:
    """The rep rows an earlier delivery stored; None if `inbox` finished this event already."""
    bench_id = event.payload.bench_id
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        if await db.processed(conn, inbox, event.event_id):
            log.info("bench %s was completed already; skipped", bench_id)
            return None
        done = await db.stored_reps(conn, bench_id)
    if done:
        log.info("bench %s: resuming with %d rep rows stored", bench_id, len(done))
    return done


async def store_rep(pool: Pool, event: Envelope[BenchRequested], row: RepRow) -> None:
    """Store one rep row and queue its `bench.rep_measured`, unless it was stored already.

    The row is written from the event (`projection`), as a rebuild from the stream writes it.
    """
    measured = logic.rep_measured(event, row)
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        if await projection.project(conn, measured):
            await outbox.add(conn, measured)


async def measure(
    pool: Pool, runner: BenchRunner, event: Envelope[BenchRequested], done: list[RepRow]
) -> BenchOutcome | MeasureError:
    """`runner.measure` in a worker thread, each new rep row stored on this event loop.

    The loop stays free meanwhile, so the bus's heartbeats keep the message for as long
    as the bench takes. A row is committed before the next rep starts, and a failed
    commit stops the bench (its delivery is then retried). A bench that cannot run
    comes back as its MeasureError.
    """
    loop = asyncio.get_running_loop()
    stopping = threading.Event()

    def on_rep(row: RepRow) -> None:
        if stopping.is_set():
            raise _Stopped
        asyncio.run_coroutine_threadsafe(store_rep(pool, event, row), loop).result()

    try:
        return await asyncio.to_thread(
            runner.measure, event.payload.plan, on_rep, done, stopping, tenant_id=event.tenant_id
        )
    except MeasureError as err:
        log.error("bench %s failed at %s: %s", event.payload.bench_id, err.error_stage, err.message)
        return err
    except asyncio.CancelledError:
        # The thread cannot be interrupted; it stops at its next rep (or while it waits
        # for the device lock) instead.
        stopping.set()
        raise


async def finish(
    pool: Pool, inbox: str, event: Envelope[BenchRequested], result: BenchOutcome | MeasureError
) -> None:
    """Queue the bench's last event and mark the request handled, in one transaction."""

    async def work(_: Any) -> tuple[Envelope[Any], ...]:
        return (logic.finished(event, result),)

    await process_once(pool, inbox, event, work)
    if isinstance(result, BenchOutcome):
        log.info(
            "bench %s completed (%d measured, %d failed)",
            event.payload.bench_id,
            len(result.results),
            len(result.failures),
        )
