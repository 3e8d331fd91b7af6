"""The benchmark-runner service: `bench.requested` in; `bench.rep_measured` per rep, then `bench.completed`.

Each rep row is stored in bench_results and its event queued in the outbox in one
transaction, as soon as its rep is measured (steps.py). A runner killed mid-bench loses
its lease on the message (no heartbeat for `bench_ack_wait_s`); JetStream redelivers it,
and the next delivery measures only the reps not stored yet (`measure(done=...)`).

A bench that cannot run (the target does not load, the baseline fails) fails the run
at once with `run.failed`: loading the same weights again in a minute would fail the
same way, so it is not retried. Anything else that breaks (database, NATS) is retried
with backoff, then parked on `spec.dlq.benchmark_runner`.
"""

from __future__ import annotations

import asyncio

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, consumer_name, make_broker, subscriber
from specbus.envelope import Envelope
from speccore.model_cache import ModelCache
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchRequested
from specops_services.benchmark_runner import logic, steps
from specops_services.benchmark_runner.runner import BenchRunner
from specops_services.benchmark_runner.settings import runner_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

SERVICE = "benchmark_runner"
HANDLER = "run_bench"


def retry_policy(ack_wait_s: float) -> RetryPolicy:
    """Backoff that rides out a database or NATS outage of a few minutes before parking."""
    return RetryPolicy(max_deliver=5, backoff_s=(1.0, 5.0, 30.0, 120.0), ack_wait_s=ack_wait_s)


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
        done = await steps.stored_reps(pool, inbox, event)
        if done is None:
            return
        result = await steps.measure(pool, runner, event, done)
        await steps.finish(pool, inbox, event, result)


def create_app(settings: Settings | None = None, *, models: ModelCache | None = None) -> FastStream:
    """The benchmark-runner process: its consumer, its outbox relay, a target kept loaded."""
    bench_settings = runner_settings(settings)
    dsn = bench_settings.require_database_url()
    broker = make_broker(
        bench_settings.require_nats_url(), service=SERVICE, **bench_settings.nats_credentials()
    )
    pool = create_pool(dsn, min_size=1, max_size=4, name=SERVICE)
    subscribe(broker, pool, BenchRunner(bench_settings, models))
    return service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER)


def serve(settings: Settings | None = None) -> None:
    """`specops serve benchmark-runner`: run until SIGINT / SIGTERM."""
    asyncio.run(create_app(settings).run())
