"""The metrics on real NATS and PostgreSQL: a consumer's deliveries counted by what became of
them, the outbox's lag, and the gateway's `/metrics` (its ops port) after a run was asked for."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fixtures.gateway import gateway_settings, issue_tokens, run_body
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from specbus import (
    OutboxRelay,
    RetryPolicy,
    Unprocessable,
    consumer_name,
    make_broker,
    outbox,
    publish,
    subscriber,
)
from specbus.envelope import Envelope, new_event
from specops_schemas.api import API_PREFIX
from specops_schemas.events import RunQueued
from specops_services.gateway.app import create_app
from specplatform.db import Pool, create_pool

FAST = RetryPolicy(max_deliver=3, backoff_s=(0.1,), ack_wait_s=5.0)
WAIT_S = 30.0
QUEUED = "spec.run.*.queued"


def _run_queued(producer: str = "tests") -> Envelope[RunQueued]:
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    return new_event(RunQueued(run_id=run_id), tenant_id="acme", correlation_id=run_id, producer=producer)


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {WAIT_S}s")
        await asyncio.sleep(0.05)


@pytest.fixture
async def pool(db: str) -> AsyncIterator[Pool]:
    async with create_pool(db, max_size=2) as opened:
        yield opened


async def test_deliveries_are_counted_as_consumed_failed_or_parked_per_subject_template(
    nats_url: str, js: JetStreamContext
) -> None:
    service = f"svc_{uuid.uuid4().hex[:8]}"
    labels = {"consumer": consumer_name(service, "on_queued"), "subject": QUEUED}
    broker = make_broker(nats_url, service=service)
    fine, flaky, poison = _run_queued(), _run_queued(), _run_queued()
    attempts: dict[str, int] = {}

    @subscriber(broker, service=service, events=RunQueued, retry=FAST, fetch_timeout_s=0.5)
    async def on_queued(event: Envelope[RunQueued]) -> None:
        attempts[event.event_id] = attempts.get(event.event_id, 0) + 1
        if event.event_id == poison.event_id:
            raise Unprocessable("never")
        if event.event_id == flaky.event_id and attempts[event.event_id] == 1:
            raise RuntimeError("once")

    await broker.start()
    try:
        for event in (fine, flaky, poison):
            await publish(js, event)
        await _wait_for(
            lambda: (
                _value("specops_bus_messages_consumed_total", **labels) == 2
                and _value("specops_bus_messages_parked_total", **labels) == 1
            ),
            "two messages consumed and one parked",
        )
    finally:
        await broker.stop()
    assert _value("specops_bus_messages_failed_total", **labels) == 1
    assert _value("specops_bus_handler_duration_seconds_count", **labels) == 4


async def test_the_relay_reports_how_many_rows_wait_and_how_old_the_oldest_is(
    js: JetStreamContext, pool: Pool
) -> None:
    producer = f"p_{uuid.uuid4().hex[:8]}"
    async with pool.connection() as conn, conn.transaction():
        for _ in range(2):
            await outbox.add(conn, _run_queued(producer))
        await conn.execute("UPDATE outbox SET created_at = now() - interval '90 seconds'")
    relay = OutboxRelay(pool, js, producer=producer)

    await relay.measure_lag()
    assert _value("specops_outbox_pending_rows", producer=producer) == 2
    assert _value("specops_outbox_oldest_pending_age_seconds", producer=producer) >= 90

    while await relay.publish_pending():
        pass
    await relay.measure_lag()
    assert _value("specops_outbox_pending_rows", producer=producer) == 0
    assert _value("specops_outbox_oldest_pending_age_seconds", producer=producer) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_the_gateways_metrics_port_shows_a_requested_run(
    db: str, nats_url: str, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    monkeypatch.setenv("SPECOPS_METRICS_PORT", str(port))
    settings = gateway_settings(db, nats_url).model_copy(update={"gateway_metrics_refresh_s": 0.1})
    app = create_app(settings)
    tokens = await issue_tokens(db)
    runs = f"{API_PREFIX}/runs"
    projected = {"consumer": "gateway-projector", "subject": QUEUED}
    consumed_before = _value("specops_bus_messages_consumed_total", **projected)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as ops,
    ):
        created = await client.post(
            runs, json=run_body(), headers={"Authorization": f"Bearer {tokens['dev']}"}
        )
        assert created.status_code == 202
        # The projector takes the run's own run.queued back from the bus (and skips it: it is
        # recorded already); the runs are recounted every 0.1 s.
        await _wait_for(
            lambda: (
                _value("specops_bus_messages_consumed_total", **projected) > consumed_before
                and _value("specops_runs_by_state", state="queued") == 1
            ),
            "the gateway's run.queued consumed and counted",
        )
        scraped = _scrape((await ops.get("/metrics")).text)

    def sample(name: str, **labels: str) -> float:
        return scraped.get((name, frozenset(labels.items())), 0.0)

    assert sample("specops_http_requests_total", method="POST", route=runs, status="202") >= 1
    assert sample("specops_http_request_duration_seconds_count", method="POST", route=runs) >= 1
    assert sample("specops_bus_messages_consumed_total", **projected) > consumed_before
    assert sample("specops_runs_by_state", state="queued") == 1
    assert sample("specops_runs_by_state", state="completed") == 0
    assert ("specops_outbox_pending_rows", frozenset({("producer", "gateway")})) in scraped
