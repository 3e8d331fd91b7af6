"""The predictor service: plans T1 runs and answers them once measured and gated.

Eight durable consumers (replicas share each): `<service>-plan` on run.requested,
`<service>-bench_completed` on bench.completed, `<service>-gate_evaluated` on
gate.evaluated, `<service>-dead_letter` on every service's dead letters
(`spec.dlq.>`): as the runs' orchestrator, the predictor fails a run whose event a
service gave up on, which would otherwise wait forever; `<service>-run_failed` on
run.failed, so that it knows which runs other services ended (it reads no other
service's table); `<service>-datastore_registered` on registry.datastore_registered:
the corpora tenants upload, which it offers as `rest` drafts in their own runs only;
`<service>-head_transitioned` on head.transitioned: the tenants' T3 heads, offered in
their own runs of the head's target once in production (uat too when a run asks); and
`<service>-policy_changed` on security.policy_changed: the tenants' security policies, so
that the runs of a tenant who opts out of speculation (F-S3), later ones and those planned
but not answered yet, get `run.completed(speculation_disabled)`.
Every handler writes Postgres and queues its events in one inbox transaction
(steps.py); the outbox relay publishes them.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import (
    RetryPolicy,
    consumer_name,
    dead_letter_subscriber,
    make_broker,
    process_once_logged,
    subscriber,
)
from specbus.dlq import DeadLetter, watch_depth
from specbus.envelope import Envelope
from specbus.tasks import cancel_until_done
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchCompleted, GateEvaluated, RunFailed, RunRequested
from specops_schemas.heads import HeadTransitioned
from specops_schemas.registry import DatastoreRegistered
from specops_schemas.security import PolicyChanged
from specops_services.predictor import logic, steps
from specops_services.predictor.calibration import load_calibrations
from specops_services.predictor.host import host_info
from specops_services.predictor.settings import predictor_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "predictor"
RETRY = RetryPolicy()
# process_once, and the service's one log line per handled event.
_once = partial(process_once_logged, logger=log, scope="run")


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    planner: steps.Planner,
    *,
    service: str = SERVICE,
    retry: RetryPolicy = RETRY,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the predictor's eight handlers on `broker` (before it starts)."""

    on = partial(subscriber, broker, service=service, retry=retry, fetch_timeout_s=fetch_timeout_s)

    @on(events=RunRequested)
    async def plan(event: Envelope[RunRequested]) -> None:
        """Rank the candidates, then request a bench or answer with the predicted best."""
        await steps.received(pool, event)
        target = await steps.load_target(event.payload.request.target.model_ref)
        await _once(
            pool, consumer_name(service, "plan"), event, lambda c: steps.plan(c, event, planner, target)
        )

    @on(events=BenchCompleted)
    async def bench_completed(event: Envelope[BenchCompleted]) -> None:
        """Store the bench's measurements; answer the run if every verdict is in."""
        await _once(
            pool, consumer_name(service, "bench_completed"), event, lambda c: steps.bench_completed(c, event)
        )

    @on(events=GateEvaluated)
    async def gate_evaluated(event: Envelope[GateEvaluated]) -> None:
        """Store a verdict; answer the run if the bench is completed and it was the last one."""
        await _once(
            pool, consumer_name(service, "gate_evaluated"), event, lambda c: steps.gate_evaluated(c, event)
        )

    @on(events=DatastoreRegistered)
    async def datastore_registered(event: Envelope[DatastoreRegistered]) -> None:
        """Remember a tenant's uploaded corpus for its later runs."""
        await _once(
            pool,
            consumer_name(service, "datastore_registered"),
            event,
            lambda c: steps.datastore_registered(c, event),
        )

    @on(events=HeadTransitioned)
    async def head_transitioned(event: Envelope[HeadTransitioned]) -> None:
        """Fold a head's lifecycle move into the heads offered to its tenant."""
        await _once(
            pool,
            consumer_name(service, "head_transitioned"),
            event,
            lambda c: steps.head_transitioned(c, event),
        )

    @on(events=PolicyChanged)
    async def policy_changed(event: Envelope[PolicyChanged]) -> None:
        """Fold a tenant's security policy: an opted-out tenant's open runs end (F-S3)."""
        await _once(
            pool, consumer_name(service, "policy_changed"), event, lambda c: steps.policy_changed(c, event)
        )

    @on(events=RunFailed)
    async def run_failed(event: Envelope[RunFailed]) -> None:
        """Note that the run has ended, whoever failed it, so that no dead letter fails it again."""
        await steps.run_failed(pool, event)

    @dead_letter_subscriber(broker, service=service, retry=retry, fetch_timeout_s=fetch_timeout_s)
    async def dead_letter(letter: DeadLetter) -> None:
        """Fail the run of a parked event, unless it has ended; anything else is only logged."""
        parked = logic.parked_event(letter)
        if parked is None:
            log.warning("dead letter from %s on %s holds no event; skipped", letter.service, letter.subject)
            return
        await _once(
            pool,
            consumer_name(service, "dead_letter"),
            parked,
            lambda c: steps.dead_letter(c, letter, parked),
            what=f"dead letter from {letter.service} of {parked.type}",
        )


def create_app(settings: Settings | None = None) -> FastStream:
    """The predictor process: its consumers, its outbox relay, its database pool."""
    config = predictor_settings(settings)
    dsn = config.require_database_url()
    broker = make_broker(
        config.require_nats_url(),
        service=SERVICE,
        # FastStream's per-message "Received"/"Processed" lines only at debug: the
        # handlers log one line per event themselves.
        logger=logging.getLogger(f"{__name__}.broker"),
        log_level=logging.DEBUG,
        **config.nats_credentials(),
    )
    pool = create_pool(dsn, min_size=1, max_size=config.predictor_pool_size, name=SERVICE)
    planner = steps.Planner(
        host=host_info(config),
        history_rows=config.predictor_history_rows,
        enable_cascade=config.enable_cascade,
        calibrations=load_calibrations(),
    )
    log.info("host: %s", planner.host)
    subscribe(broker, pool, planner)
    app = service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER, logger=log)
    counting: list[asyncio.Task[None]] = []

    # The predictor takes every dead letter already, so it is where their number is shown.
    @app.after_startup
    async def count_dead_letters() -> None:
        counting.append(asyncio.get_running_loop().create_task(watch_depth(broker)))

    @app.on_shutdown
    async def stop_counting() -> None:
        await cancel_until_done(counting)

    return app


def serve(settings: Settings | None = None) -> None:
    """`specops serve predictor`: run until SIGINT / SIGTERM, then stop cleanly."""
    asyncio.run(create_app(settings).run())
