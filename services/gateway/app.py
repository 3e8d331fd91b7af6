"""The gateway service: FastAPI app factory, its lifespan (Postgres, NATS, background tasks), probes."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from psycopg_pool import AsyncConnectionPool

from specbus.broker import SpecBroker, make_broker, upstream_stream_configs
from specbus.outbox import OutboxRelay
from specbus.tasks import cancel_until_done
from specops_schemas import MIGRATIONS
from specops_schemas.api import Problem
from specops_schemas.events import RunCompleted, RunFailed, RunQueued, RunRequested
from specops_schemas.heads import HeadFailed, HeadRequested, HeadTransitioned
from specops_schemas.registry import DatastoreRegistered
from specops_schemas.security import PolicyChangeRequested, SecurityRefused
from specops_schemas.tune import TuneRequested
from specops_services.gateway import idempotency, projecting, results
from specops_services.gateway.console import router as console
from specops_services.gateway.datastores import routes as datastores
from specops_services.gateway.heads import projector as heads_projector
from specops_services.gateway.heads import routes as heads_routes
from specops_services.gateway.http import db as http_db
from specops_services.gateway.http.limits import body_too_large
from specops_services.gateway.http.listener import RunEventsListener
from specops_services.gateway.http.problems import install, problem_response, responses
from specops_services.gateway.http.socket import claim_port, deployment_id, listening_socket
from specops_services.gateway.live_workload import projector as live_workload_projector
from specops_services.gateway.metrics import HttpMetrics, count_runs
from specops_services.gateway.runs import intake, projector, reaper, routes
from specops_services.gateway.security import projector as security_projector
from specops_services.gateway.security import routes as security_routes
from specops_services.gateway.settings import GatewaySettings, gateway_settings
from specops_services.gateway.tune import projector as tune_projector
from specops_services.gateway.tune import routes as tune_routes
from specplatform.body_limit import BodyLimit
from specplatform.db import (
    create_pool,
    migrate,
    role_transaction,
    wait_for_database,
)
from specplatform.json_body import require_json
from specplatform.ops import process_ops
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = projecting.SERVICE
"""The gateway's name on the bus (consumer names, dead-letter subject, inbox prefix)."""

PURGE_INTERVAL_S = 600.0
# Not traced: the probes (a trace per poll) and the event streams (an open stream polls
# the database four times a second: thousands of spans in one trace).
UNTRACED_URLS = "/healthz$,/readyz$,/runs/[^/]+/events$,/tune-sessions/[^/]+/events$,/heads/[^/]+/events$"


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or gateway_settings()
    app = FastAPI(
        title="specops gateway",
        version="1",
        description="T1 speculative-decoding runs, T2 tune sessions and the T3 head registry. "
        "Errors are `application/problem+json`.",
        lifespan=_lifespan,
        dependencies=[Depends(require_json)],
    )
    app.state.settings = settings
    app.state.listener = None
    install(app, retry_after_s=settings.gateway_retry_after_s)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.gateway_max_body_bytes,
        refusal=body_too_large,
        per_path={
            datastores.DATASTORES_PATH: settings.datastore_max_bytes,
            heads_routes.HEAD_DATA_PATH: settings.datastore_max_bytes,
        },
    )
    console.install(app)
    # Added last, so outermost: it counts what the body limit refuses too.
    app.add_middleware(HttpMetrics, templates=lambda: app.openapi()["paths"])
    app.include_router(routes.router)
    app.include_router(tune_routes.router)
    app.include_router(datastores.router)
    app.include_router(heads_routes.router)
    app.include_router(security_routes.router)
    app.add_api_route("/healthz", _healthz, methods=["GET"], tags=["probes"], summary="Process is alive")
    app.add_api_route(
        "/readyz",
        _readyz,
        methods=["GET"],
        tags=["probes"],
        summary="Postgres and NATS reachable",
        responses=responses(503),
    )
    # A server span per request (a no-op unless `specops serve` configured tracing),
    # without the ASGI send/receive spans of every message of a response.
    FastAPIInstrumentor.instrument_app(
        app,
        exclude_spans=["receive", "send"],
        excluded_urls=os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", UNTRACED_URLS),
    )
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: GatewaySettings = app.state.settings
    dsn = settings.require_database_url()
    broker = make_broker(settings.require_nats_url(), service="gateway", **settings.nats_credentials())
    ops = process_ops(broker, dsn)
    if ops is not None:
        await ops.start()
    await wait_for_database(dsn)
    await migrate(dsn, MIGRATIONS)
    pool = create_pool(
        dsn, max_size=settings.gateway_pool_size, name="gateway", timeout_s=settings.gateway_db_timeout_s
    )
    await pool.open(wait=True)
    broker.declare_streams(upstream_stream_configs())
    subscribe(
        broker,
        pool,
        projectors=settings.gateway_projector,
        intake_runs=settings.gateway_intake,
        max_active_runs=settings.gateway_max_active_runs,
        live_fingerprint=settings.enable_auto_workload_fingerprint,
    )
    tasks: list[asyncio.Task[None]] = []
    try:
        await broker.start()
        listener = RunEventsListener(dsn)
        app.state.pool, app.state.broker, app.state.listener = pool, broker, listener
        tasks.append(_spawn(listener.run()))
        tasks.append(_spawn(_purge_keys(app)))
        tasks.append(_spawn(count_runs(pool, every_s=settings.gateway_metrics_refresh_s)))
        if settings.gateway_relay:
            tasks.append(_spawn(OutboxRelay(pool, broker, producer=results.PRODUCER).run()))
        if settings.gateway_reaper:
            deadlines = settings.stage_deadlines()
            tasks.append(_spawn(reaper.run(pool, deadlines, interval_s=settings.reaper_interval_s)))
        yield
    finally:
        await _stop(tasks)
        await broker.stop()
        await pool.close()
        if ops is not None:
            await ops.stop()


def subscribe(
    broker: SpecBroker,
    pool: AsyncConnectionPool,
    *,
    projectors: bool = True,
    intake_runs: bool = True,
    max_active_runs: int = 1,
    live_fingerprint: bool = False,
) -> None:
    """Register the gateway's bus handlers: its projectors (runs, tune sessions, heads, security,
    live workloads) and the intake of upstream run requests, each unless switched off."""
    if projectors:
        projector.register(broker, pool)
        tune_projector.register(broker, pool)
        heads_projector.register(broker, pool)
        security_projector.register(broker, pool)
        live_workload_projector.register(broker, pool)
    if intake_runs:
        intake.register(broker, pool, max_active_runs=max_active_runs, live_fingerprint=live_fingerprint)


def _spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro)


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    await cancel_until_done(tasks)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task %s ended with %r", task.get_name(), task.exception())


async def _purge_keys(app: FastAPI) -> None:
    """Expired idempotency keys are invisible already; this only reclaims their rows."""
    while True:
        try:
            async with app.state.pool.connection() as conn, role_transaction(conn, idempotency.KEY_PURGER):
                await idempotency.purge_expired_keys(conn)
        except Exception as exc:
            log.warning("could not purge expired idempotency keys: %r", exc)
        await asyncio.sleep(PURGE_INTERVAL_S)


async def _healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _readyz(request: Request) -> JSONResponse:
    problems = []
    try:
        async with request.app.state.pool.connection() as conn:
            await http_db.ping(conn)
    except Exception as exc:
        problems.append(f"postgres: {type(exc).__name__}")
    if not await request.app.state.broker.ping(timeout=1.0):
        problems.append("nats: not connected")
    if problems:
        return problem_response(Problem(title="Service Unavailable", status=503, detail="; ".join(problems)))
    return JSONResponse({"status": "ready"})


def serve(settings: Settings | None = None) -> None:
    """`specops serve gateway`: run the app under uvicorn on the configured host and port.

    Replicas of the gateway on one host (`specops up --replicas gateway=N`) all listen
    on that port (http/socket.py) and the kernel spreads new connections over them; what the
    gateway keeps between requests (idempotency keys, runs, the SSE feed) is in
    Postgres, so any replica answers any request.
    """
    import uvicorn

    gateway = gateway_settings(settings)
    host, port = gateway.gateway_host, gateway.gateway_port
    deployment = deployment_id(gateway.require_database_url(), gateway.require_nats_url())
    claim = claim_port(host, port, deployment)
    try:
        sock = listening_socket(host, port)
        uvicorn.Server(uvicorn.Config(create_app(gateway), host=host, port=port)).run(sockets=[sock])
    finally:
        os.close(claim)


# What the gateway publishes on SPEC (its NATS user may publish these subjects, and the
# tenants' result subjects, only); run.failed is the reaper's, tune.requested POST tune-sessions',
# registry.datastore_registered the datastores upload's, head.failed the heads projector's for a
# head whose event a service parked, security.policy_requested PUT security/policy's and
# security.refused every refusal for a tenant's security policy (refusals.Refused).
PUBLISHES = (
    RunRequested,
    RunQueued,
    RunCompleted,
    RunFailed,
    TuneRequested,
    DatastoreRegistered,
    HeadRequested,
    HeadTransitioned,
    HeadFailed,
    PolicyChangeRequested,
    SecurityRefused,
)
