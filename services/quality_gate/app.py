"""The quality-gate service: `bench.completed` in, one `gate.evaluated` per measured candidate out;
`head.trained` in, one `head.gated` (or `head.failed`) per trained head artifact out.

Two durable consumers (replicas share each): `<service>-gate_bench` on bench.completed and
`<service>-head_trained` on head.trained (T3: the head decoded on its held-out prompts
against the target alone, services/quality_gate/heads.py). The handlers hand the event
to steps.py, which stores each verdict and queues its event in one transaction; the
outbox relay publishes them.
"""

from __future__ import annotations

import asyncio

import torch
from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, consumer_name, make_broker, subscriber
from specbus.envelope import Envelope
from speccore.model_cache import ModelCache
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchCompleted
from specops_schemas.heads import HeadTrained
from specops_services.quality_gate import logic, steps
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import gate_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

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
    """Register the gate's handlers on `broker` (durable consumers `<service>-gate_bench`,
    `<service>-head_trained`)."""

    @subscriber(broker, service=service, events=BenchCompleted, retry=retry, fetch_timeout_s=fetch_timeout_s)
    async def gate_bench(event: Envelope[BenchCompleted]) -> None:
        """Gate every measured candidate of the bench that has no stored verdict yet."""
        await steps.gate_bench(pool, runner, event)

    @subscriber(broker, service=service, events=HeadTrained, retry=retry, fetch_timeout_s=fetch_timeout_s)
    async def head_trained(event: Envelope[HeadTrained]) -> None:
        """Gate a trained head once: head.gated (passed or not, why) or head.failed."""
        await steps.gate_head(pool, runner, consumer_name(service, "head_trained"), event)


def create_app(settings: Settings | None = None, *, models: ModelCache | None = None) -> FastStream:
    """The quality-gate process: its consumer, its outbox relay, a target kept loaded."""
    config = gate_settings(settings)
    dsn = config.require_database_url()
    broker = make_broker(config.require_nats_url(), service=SERVICE, **config.nats_credentials())
    pool = create_pool(dsn, min_size=1, max_size=config.gate_pool_size, name=SERVICE)
    subscribe(broker, pool, GateRunner(config, models))
    app = service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER)

    @app.on_startup
    def use_threads() -> None:
        torch.set_num_threads(config.threads)

    return app


def serve(settings: Settings | None = None) -> None:
    """`specops serve quality-gate`: run until SIGINT / SIGTERM."""
    asyncio.run(create_app(settings).run())
