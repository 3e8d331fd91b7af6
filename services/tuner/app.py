"""The tuner service: T2 sessions, a budgeted Bayesian search (Optuna) measured over the bus.

Six durable consumers (replicas share each): `<service>-requested` on tune.requested,
`<service>-bench_completed` on bench.completed and `<service>-gate_evaluated` on
gate.evaluated (of the benches it requested for its trials; others are skipped),
`<service>-run_failed` on run.failed (a session's bench that could not run), and
`<service>-dead_letter` on every service's dead letters (a trial's parked bench event
fails that trial), and `<service>-policy_changed` on security.policy_changed: the tenants'
security policies, so that the sessions of a tenant who opts out of speculation (F-S3), open
ones and later ones, end at once with `tune.completed(speculation_disabled)`: no further
trial. Every handler locks the session and queues its events in one inbox transaction
(steps.py); the outbox relay publishes them. A ticker task keeps the budget clock: it
heartbeats the running sessions (a gap is downtime) and ends those whose deadline has
passed with a trial still in flight.
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
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope
from specbus.tasks import cancel_until_done
from specops_schemas import MIGRATIONS
from specops_schemas.events import BenchCompleted, GateEvaluated, RunFailed, parse_event
from specops_schemas.security import PolicyChanged
from specops_schemas.tune import TuneRequested
from specops_services.tuner import logic, steps
from specops_services.tuner.settings import TunerSettings, tuner_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "tuner"
RETRY = RetryPolicy()
# process_once, and the service's one log line per handled event.
_once = partial(process_once_logged, logger=log, scope="session")


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    tuner: steps.Tuner,
    *,
    service: str = SERVICE,
    retry: RetryPolicy = RETRY,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the tuner's six handlers on `broker` (before it starts)."""

    on = partial(subscriber, broker, service=service, retry=retry, fetch_timeout_s=fetch_timeout_s)

    @on(events=TuneRequested)
    async def requested(event: Envelope[TuneRequested]) -> None:
        """Create the session and its study, start the budget clock, request the first trial."""
        await _once(
            pool, consumer_name(service, "requested"), event, lambda c: steps.requested(c, event, tuner)
        )

    @on(events=BenchCompleted)
    async def bench_completed(event: Envelope[BenchCompleted]) -> None:
        """Store a trial's measurement; end the trial once its verdict is in."""
        await _once(
            pool,
            consumer_name(service, "bench_completed"),
            event,
            lambda c: steps.bench_completed(c, event, tuner),
        )

    @on(events=GateEvaluated)
    async def gate_evaluated(event: Envelope[GateEvaluated]) -> None:
        """Store a trial's verdict; end the trial once it is measured."""
        await _once(
            pool,
            consumer_name(service, "gate_evaluated"),
            event,
            lambda c: steps.gate_evaluated(c, event, tuner),
        )

    @on(events=PolicyChanged)
    async def policy_changed(event: Envelope[PolicyChanged]) -> None:
        """Fold a tenant's security policy: an opted-out tenant's sessions end, no further trial (F-S3)."""
        await _once(
            pool,
            consumer_name(service, "policy_changed"),
            event,
            lambda c: steps.policy_changed(c, event, tuner),
        )

    @on(events=RunFailed)
    async def run_failed(event: Envelope[RunFailed]) -> None:
        """A session's bench could not run: fail its trial, or the session if the target cannot load."""
        await _once(
            pool, consumer_name(service, "run_failed"), event, lambda c: steps.run_failed(c, event, tuner)
        )

    @dead_letter_subscriber(broker, service=service, retry=retry, fetch_timeout_s=fetch_timeout_s)
    async def dead_letter(letter: DeadLetter) -> None:
        """Fail the trial whose bench event a service parked; anything else is skipped."""
        try:
            parked = parse_event(letter.data)
        except ValueError:
            log.warning("dead letter from %s on %s holds no event; skipped", letter.service, letter.subject)
            return
        await _once(
            pool,
            consumer_name(service, "dead_letter"),
            parked,
            lambda c: steps.dead_letter(c, tuner, letter, parked),
            what=f"dead letter from {letter.service} of {parked.type}",
        )


def make_tuner(config: TunerSettings, dsn: str) -> steps.Tuner:
    return steps.Tuner(
        dsn=dsn,
        bench=logic.BenchSize(
            reps=config.tuner_reps, n_prompts=config.tuner_prompts, max_new_tokens=config.tuner_new_tokens
        ),
        parallel=config.tuner_parallel_trials,
        tick_s=config.tuner_tick_s,
        grace_s=config.tuner_grace_s,
        narrow_after=config.tuner_narrow_after,
        narrow_threshold=config.tuner_narrow_threshold,
    )


async def run_ticker(pool: Pool, tuner: steps.Tuner) -> None:
    """The budget clock: `steps.tick` every `tick_s` until cancelled; a failed tick is logged."""
    while True:
        try:
            await steps.tick(pool, tuner)
        except Exception:
            log.exception("budget tick failed; trying again in %.1f s", tuner.tick_s)
        await asyncio.sleep(tuner.tick_s)


def create_app(settings: Settings | None = None) -> FastStream:
    """The tuner process: its consumers, its budget ticker, its outbox relay, its database pool."""
    config = tuner_settings(settings)
    dsn = config.require_database_url()
    broker = make_broker(
        config.require_nats_url(),
        service=SERVICE,
        logger=logging.getLogger(f"{__name__}.broker"),
        log_level=logging.DEBUG,
        **config.nats_credentials(),
    )
    pool = create_pool(dsn, min_size=1, max_size=config.tuner_pool_size, name=SERVICE)
    tuner = make_tuner(config, dsn)
    subscribe(broker, pool, tuner)
    app = service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER, logger=log)
    ticking: list[asyncio.Task[None]] = []

    @app.after_startup
    async def start_ticker() -> None:
        ticking.append(asyncio.get_running_loop().create_task(run_ticker(pool, tuner)))

    @app.on_shutdown
    async def stop_ticker() -> None:
        await cancel_until_done(ticking)

    return app


def serve(settings: Settings | None = None) -> None:
    """`specops serve tuner`: run until SIGINT / SIGTERM, then stop cleanly."""
    asyncio.run(create_app(settings).run())
