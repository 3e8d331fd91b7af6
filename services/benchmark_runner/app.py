"""The benchmark-runner service: `bench.requested` in; `bench.rep_measured` per rep, then `bench.completed`.

Each rep row is stored in bench_results and its event queued in the outbox in one
transaction, as soon as its rep is measured. A runner killed mid-bench loses its lease
on the message (no heartbeat for `bench_ack_wait_s`); JetStream redelivers it, and the
next delivery measures only the reps not stored yet (`measure(done=...)`).

A bench that cannot run (the target does not load, the baseline fails) fails the run
at once with `run.failed`: loading the same weights again in a minute would fail the
same way, so it is not retried. Anything else that breaks (database, NATS) is retried
with backoff, then parked on `spec.dlq.benchmark_runner`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, consumer_name, make_broker, outbox, process_once, subscriber
from specbus.envelope import Envelope
from specbus.inbox import Work
from speccore.model_cache import ModelCache
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchPlan, BenchRequested, RepMetrics
from specops_services.benchmark_runner import db, logic
from specops_services.benchmark_runner.measure import BenchOutcome, MeasureError, RepRow
from specops_services.benchmark_runner.runner import BenchRunner
from specops_services.benchmark_runner.settings import runner_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "benchmark_runner"
HANDLER = "run_bench"


def retry_policy(ack_wait_s: float) -> RetryPolicy:
    """Backoff that rides out a database or NATS outage of a few minutes before parking."""
    return RetryPolicy(max_deliver=5, backoff_s=(1.0, 5.0, 30.0, 120.0), ack_wait_s=ack_wait_s)


class _Stopped(Exception):
    """The handler was cancelled (shutdown): the measuring thread stops at its next rep."""


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    runner: BenchRunner,
    *,
    service: str = SERVICE,
    retry: RetryPolicy | None = None,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the runner's handler on `broker` (durable consumer `<service>-run_bench`)."""
    inbox = consumer_name(service, HANDLER)
    policy = retry or retry_policy(runner.settings.bench_ack_wait_s)

    @subscriber(
        broker,
        service=service,
        events=BenchRequested,
        name=HANDLER,
        retry=policy,
        fetch_timeout_s=fetch_timeout_s,
    )
    async def run_bench(event: Envelope[BenchRequested]) -> None:
        """Measure the reps of the bench not stored yet, then publish its summary."""
        bench = event.payload
        async with pool.connection() as conn:
            if await db.processed(conn, inbox, event.event_id):
                log.info("bench %s was completed already; skipped", bench.bench_id)
                return
            done = await db.stored_reps(conn, bench.bench_id)
        if done:
            log.info("bench %s: resuming with %d rep rows stored", bench.bench_id, len(done))

        async def store(row: RepRow) -> None:
            async with pool.connection() as conn, conn.transaction():
                if await db.insert_rep(conn, bench_id=bench.bench_id, run_id=bench.plan.run_id, row=row):
                    await outbox.add(conn, logic.rep_measured(event, row))

        try:
            outcome = await _measure(runner, bench.plan, done, store)
        except MeasureError as err:
            log.error("bench %s failed at %s: %s", bench.bench_id, err.error_stage, err.message)
            await process_once(pool, inbox, event, _emit(logic.failed(event, err)))
            return
        await process_once(pool, inbox, event, _emit(logic.completed(event, outcome)))
        log.info(
            "bench %s completed (%d measured, %d failed)",
            bench.bench_id,
            len(outcome.results),
            len(outcome.failures),
        )


async def _measure(
    runner: BenchRunner,
    plan: BenchPlan,
    done: Sequence[RepRow],
    store: Callable[[RepRow], Coroutine[Any, Any, None]],
) -> BenchOutcome:
    """`runner.measure` in a worker thread, each new rep row stored by `store` on this event loop.

    The loop stays free meanwhile, so the bus's heartbeats keep the message for as long
    as the bench takes. A row is committed before the next rep starts, and a failed
    commit stops the bench (its delivery is then retried).
    """
    loop = asyncio.get_running_loop()
    stopping = threading.Event()

    def on_rep(candidate_id: str, rep: int, metrics: RepMetrics, speedup: float | None) -> None:
        if stopping.is_set():
            raise _Stopped
        row = RepRow(candidate_id, rep, metrics, speedup)
        asyncio.run_coroutine_threadsafe(store(row), loop).result()

    try:
        return await asyncio.to_thread(runner.measure, plan, on_rep, done)
    except asyncio.CancelledError:
        # The thread cannot be interrupted; it stops at its next rep instead.
        stopping.set()
        raise


def _emit(*events: Envelope[Any]) -> Work:
    async def work(_: Any) -> tuple[Envelope[Any], ...]:
        return events

    return work


def create_app(settings: Settings | None = None, *, models: ModelCache | None = None) -> FastStream:
    """The benchmark-runner process: its consumer, its outbox relay, a target kept loaded."""
    bench_settings = runner_settings(settings)
    dsn = bench_settings.require_database_url()
    broker = make_broker(bench_settings.require_nats_url(), service=SERVICE)
    pool = create_pool(dsn, min_size=1, max_size=4, name=SERVICE)
    subscribe(broker, pool, BenchRunner(bench_settings, models))
    return service_app(broker, pool, dsn, migrations=MIGRATIONS)


def serve(settings: Settings | None = None) -> None:
    """`specops serve benchmark-runner`: run until SIGINT / SIGTERM."""
    asyncio.run(create_app(settings).run())
