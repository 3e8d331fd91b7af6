"""The ops endpoints (specplatform.ops) on a real nats-server and PostgreSQL: /metrics, /healthz."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
from fixtures.nats import NatsServer
from prometheus_client import Counter

from specbus import make_broker
from specplatform.db import wait_for_database
from specplatform.ops import DATABASE_CHECK, NATS_CHECK, DatabaseProbe, OpsServer, broker_connected

# A database no server answers: a socket dir that does not exist.
NOWHERE = "postgresql:///specops?host=/nonexistent-specops-socket-dir"


async def _get(server: OpsServer, path: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"http://127.0.0.1:{server.bound_port}{path}", timeout=5.0)


async def test_metrics_serve_the_default_registry() -> None:
    name = f"specops_test_ops_{uuid.uuid4().hex[:8]}"
    counter = Counter(name, "A counter only this test moves.")
    counter.inc(3)
    server = OpsServer(0)
    server.start()
    try:
        response = await _get(server, "/metrics")
    finally:
        server.stop()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert f"{name}_total 3.0" in response.text


async def test_healthz_reports_each_check(nats_url: str, database_url: str) -> None:
    broker = make_broker(nats_url, service="ops-test")
    probe = DatabaseProbe(database_url, interval_s=0.2)
    server = OpsServer(0, checks={NATS_CHECK: broker_connected(broker), DATABASE_CHECK: probe})
    server.start()
    task = asyncio.create_task(probe.run())
    try:
        before = await _get(server, "/healthz")
        await broker.connect()
        while not probe.ok:
            await asyncio.sleep(0.05)
        healthy = await _get(server, "/healthz")
    finally:
        task.cancel()
        await broker.stop()
        server.stop()
    assert before.status_code == 503
    assert before.json()["checks"][NATS_CHECK] is False
    assert healthy.status_code == 200
    assert healthy.json() == {"status": "ok", "checks": {NATS_CHECK: True, DATABASE_CHECK: True}}


async def test_healthz_names_a_lost_nats_connection(tmp_path: Path) -> None:
    nats = NatsServer(tmp_path)
    nats.start()
    broker = make_broker(nats.url, service="ops-test")
    server = OpsServer(0, checks={NATS_CHECK: broker_connected(broker), "always": lambda: True})
    server.start()
    try:
        await broker.connect()
        assert (await _get(server, "/healthz")).status_code == 200
        nats.stop()
        while broker_connected(broker)():
            await asyncio.sleep(0.05)
        lost = await _get(server, "/healthz")
        nats.start()
        while not broker_connected(broker)():
            await asyncio.sleep(0.05)
        back = await _get(server, "/healthz")
    finally:
        await broker.stop()
        server.stop()
        nats.stop()
    assert lost.status_code == 503
    assert lost.json() == {"status": "unhealthy", "checks": {NATS_CHECK: False, "always": True}}
    assert back.status_code == 200


async def test_a_raising_check_fails_without_breaking_the_endpoint() -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    server = OpsServer(0, checks={"broken": broken})
    server.start()
    try:
        response = await _get(server, "/healthz")
    finally:
        server.stop()
    assert response.status_code == 503
    assert response.json()["checks"] == {"broken": False}


async def test_database_probe_reads_unreachable_database_as_failing() -> None:
    probe = DatabaseProbe(NOWHERE, interval_s=0.1)
    task = asyncio.create_task(probe.run())
    await asyncio.sleep(0.5)
    task.cancel()
    assert probe() is False


async def test_wait_for_database_waits_while_unreachable(database_url: str) -> None:
    waiting = asyncio.create_task(wait_for_database(NOWHERE, base_s=0.05, cap_s=0.1))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    waiting.cancel()
    await asyncio.wait_for(wait_for_database(database_url), timeout=10.0)
