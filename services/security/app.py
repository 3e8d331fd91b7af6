"""The security service: every tenant's security policy (tier, F-S2 jitter, F-S3 opt-out, GPU
budget) and the count of its measurement time.

Four durable consumers (replicas share each): `<service>-policy_requested` on
security.policy_requested (an admin's PUT, from the gateway) -> security.policy_changed with
the whole new policy, which the other services fold into their own read models;
`<service>-rep_measured` on bench.rep_measured (T1 benches and T2 trials), and
`<service>-head_epoch` on head.epoch_completed and `<service>-head_trained` on head.trained
(T3, each adding the training seconds not counted yet): device seconds counted against the
tenant's calendar month (UTC), with security.budget_exhausted once the count reaches the
tenant's `gpu_budget_s`. Every handler writes Postgres and queues its events in one inbox
transaction (steps.py); the outbox relay publishes them.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, consumer_name, make_broker, process_once_logged, subscriber
from specbus.envelope import Envelope
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchRepMeasured
from specops_schemas.heads import HeadEpochCompleted, HeadTrained
from specops_schemas.security import PolicyChangeRequested
from specops_services.security import logic, steps
from specops_services.security.settings import security_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "security"
RETRY = RetryPolicy()
# process_once, and the service's one log line per handled event.
_once = partial(process_once_logged, logger=log, scope="correlation")


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    *,
    service: str = SERVICE,
    retry: RetryPolicy = RETRY,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the security service's four handlers on `broker` (before it starts)."""

    on = partial(subscriber, broker, service=service, retry=retry, fetch_timeout_s=fetch_timeout_s)

    @on(events=PolicyChangeRequested)
    async def policy_requested(event: Envelope[PolicyChangeRequested]) -> None:
        """Apply an admin's new policy and announce it."""
        await _once(
            pool,
            consumer_name(service, "policy_requested"),
            event,
            lambda c: steps.policy_requested(c, event),
        )

    @on(events=BenchRepMeasured)
    async def rep_measured(event: Envelope[BenchRepMeasured]) -> None:
        """Count a measured rep's seconds against its tenant's month."""
        await _once(
            pool, consumer_name(service, "rep_measured"), event, lambda c: steps.rep_measured(c, event)
        )

    @on(events=HeadEpochCompleted)
    async def head_epoch(event: Envelope[HeadEpochCompleted]) -> None:
        """Count a head's training seconds up to this epoch against its tenant's month."""
        await _once(
            pool, consumer_name(service, "head_epoch"), event, lambda c: steps.head_progress(c, event)
        )

    @on(events=HeadTrained)
    async def head_trained(event: Envelope[HeadTrained]) -> None:
        """Count the rest of a trained head's training seconds against its tenant's month."""
        await _once(
            pool, consumer_name(service, "head_trained"), event, lambda c: steps.head_progress(c, event)
        )


def create_app(settings: Settings | None = None) -> FastStream:
    """The security process: its consumers, its outbox relay, its database pool."""
    config = security_settings(settings)
    dsn = config.require_database_url()
    broker = make_broker(
        config.require_nats_url(),
        service=SERVICE,
        logger=logging.getLogger(f"{__name__}.broker"),
        log_level=logging.DEBUG,
        **config.nats_credentials(),
    )
    pool = create_pool(dsn, min_size=1, max_size=config.security_pool_size, name=SERVICE)
    subscribe(broker, pool)
    return service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER, logger=log)


def serve(settings: Settings | None = None) -> None:
    """`specops serve security`: run until SIGINT / SIGTERM, then stop cleanly."""
    asyncio.run(create_app(settings).run())
