"""The quality-gate service: `bench.completed` in, one `gate.evaluated` per measured candidate out.

Each verdict is stored in gate_results and its event queued in the outbox in one
transaction, candidate by candidate, so a process that dies mid-bench resumes with
the candidates it had not gated yet (see flow.py for what is published when).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import torch
from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, make_broker, outbox, subscriber
from specbus.envelope import Envelope
from speccore.model_cache import ModelCache, ModelLoadError
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchCompleted
from specops_services.quality_gate import db, flow
from specops_services.quality_gate.runner import GateRunner, QualityGateSettings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings, load_settings

log = logging.getLogger(__name__)

SERVICE = "quality_gate"
# Heartbeats keep a bench for as long as gating takes; the backoff covers a database
# or NATS outage of a few minutes before the message is parked.
RETRY = RetryPolicy(max_deliver=6, backoff_s=(1.0, 5.0, 30.0, 120.0), ack_wait_s=60.0)


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    runner: GateRunner,
    *,
    service: str = SERVICE,
    retry: RetryPolicy = RETRY,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the gate's handler on `broker` (durable consumer `<service>-gate_bench`)."""

    @subscriber(broker, service=service, events=BenchCompleted, retry=retry, fetch_timeout_s=fetch_timeout_s)
    async def gate_bench(event: Envelope[BenchCompleted]) -> None:
        """Gate every measured candidate of the bench that has no stored verdict yet."""
        bench = event.payload
        async with pool.connection() as conn:
            todo = flow.to_gate(bench, await db.stored_outcomes(conn, bench.bench_id))
        if not todo:
            log.info("bench %s: no measured candidate left to gate", bench.bench_id)
            return
        await _queue(pool, [flow.gating_started(event)])
        for candidate in todo:
            try:
                outcome = await asyncio.to_thread(runner.evaluate, bench.plan, candidate)
            except ModelLoadError as err:
                log.error("bench %s: %s", bench.bench_id, err)
                await _queue(pool, [flow.target_unavailable(event, str(err))])
                return
            cid = candidate.candidate_id
            async with pool.connection() as conn, conn.transaction():
                saved = await db.save_outcome(
                    conn, bench_id=bench.bench_id, run_id=bench.plan.run_id, candidate_id=cid, outcome=outcome
                )
                if saved:
                    await outbox.add(conn, flow.gate_evaluated(event, cid, outcome))
            log.info("bench %s: %s %s passed=%s", bench.bench_id, cid, outcome.method, outcome.passed)


async def _queue(pool: Pool, events: Sequence[Envelope[Any]]) -> None:
    async with pool.connection() as conn, conn.transaction():
        for event in events:
            await outbox.add(conn, event)


def create_app(settings: Settings | None = None, *, models: ModelCache | None = None) -> FastStream:
    """The quality-gate process: its consumer, its outbox relay, a target kept loaded."""
    gate_settings = _gate_settings(settings)
    dsn = gate_settings.require_database_url()
    broker = make_broker(gate_settings.require_nats_url(), service=SERVICE)
    pool = create_pool(dsn, min_size=1, max_size=4, name=SERVICE)
    subscribe(broker, pool, GateRunner(gate_settings, models))
    app = service_app(broker, pool, dsn, migrations=MIGRATIONS)

    @app.on_startup
    def use_threads() -> None:
        torch.set_num_threads(gate_settings.threads)

    return app


def serve(settings: Settings | None = None) -> None:
    """`specops serve quality-gate`: run until SIGINT / SIGTERM."""
    asyncio.run(create_app(settings).run())


def _gate_settings(settings: Settings | None) -> QualityGateSettings:
    if isinstance(settings, QualityGateSettings):
        return settings
    # The shared settings say where the servers are; the gate's own knobs are read by
    # the same rules (environment, then the state dir's runtime.env).
    state_dir = settings.state_dir if settings is not None else None
    loaded = load_settings(state_dir, cls=QualityGateSettings)
    if settings is None:
        return loaded
    return loaded.model_copy(update={"nats_url": settings.nats_url, "database_url": settings.database_url})
