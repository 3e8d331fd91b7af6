"""The engine server's own NATS user (`engine`, not admin: it is the internet-facing pod), on a
real nats-server with the users `specops nats config` generates: the engine's policy feed
catches up and follows new policies, its drift events are published, and anything else (another
service's events, reading the bus at large, a consumer on other subjects) is refused."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout

from specbus import publish
from specbus.broker import ensure_stream, inbox_prefix
from specbus.envelope import new_event
from specbus.subjects import STREAM
from specops.runtime.nats_auth import ADMIN, ENGINE, Keys, all_users, render_config
from specops.runtime.nats_server import find_binary
from specops.runtime.topology import service_users
from specops_schemas.security import PolicyChanged, SecurityPolicy, SecurityTier
from specops_services.engine.security import SecurityPolicies
from specops_services.engine.security_events import PolicyFeed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, Keys]]:
    """nats-server taking only the generated users; the URL and their seeds."""
    keys = Keys(tmp_path)
    port = _free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        render_config(
            host="127.0.0.1",
            port=port,
            monitor_port=_free_port(),
            store_dir=tmp_path / "data",
            users=all_users(keys, service_users()),
        )
    )
    process = subprocess.Popen(
        [str(find_binary()), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "nats-server exited"
            subprocess.run(["sleep", "0.1"], check=True)
        yield f"nats://127.0.0.1:{port}", keys
    finally:
        process.terminate()
        process.wait(timeout=10)


def _policy(tenant: str, version: int = 1) -> Any:
    policy = SecurityPolicy(tenant_id=tenant, version=version, tier=SecurityTier.MULTI_TENANT_ISOLATED)
    return new_event(
        PolicyChanged(tenant_id=tenant, policy=policy),
        tenant_id=tenant,
        correlation_id="t",
        producer="security",
    )


@pytest.fixture
async def admin(secured: tuple[str, Keys]) -> AsyncIterator[Any]:
    """The runtime's side: SPEC exists before the engine starts (the engine may not create it)."""
    url, keys = secured
    nc = await nats.connect(url, nkeys_seed=str(keys.seed_file(ADMIN)))
    await ensure_stream(nc.jetstream())
    yield nc
    await nc.close()


async def _engine(url: str, keys: Keys, errors: list[Exception]) -> Any:
    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    return await nats.connect(
        url,
        nkeys_seed=str(keys.seed_file(ENGINE)),
        inbox_prefix=inbox_prefix(ENGINE),
        error_cb=on_error,
        allow_reconnect=False,
    )


async def test_the_engine_user_follows_policies_and_publishes_drift_events(
    secured: tuple[str, Keys], admin: Any
) -> None:
    url, keys = secured
    js = admin.jetstream()
    await publish(js, _policy("acme"))
    policies = SecurityPolicies()
    feed = PolicyFeed(policies, url, "s1", {"nkeys_seed": str(keys.seed_file(ENGINE))})
    await feed.start()  # raises unless the backlog (acme's policy) arrived
    try:
        assert "acme" in policies.tenants
        await publish(js, _policy("later"))
        for _ in range(50):
            if "later" in policies.tenants:
                break
            await asyncio.sleep(0.1)
        assert "later" in policies.tenants
    finally:
        await feed.stop()
    errors: list[Exception] = []
    nc = await _engine(url, keys, errors)
    try:
        ack = await nc.jetstream().publish("spec.serve.s1.drift_detected", b"{}", timeout=5)
        assert ack.stream == STREAM
    finally:
        await nc.close()


async def test_the_engine_user_may_not_forge_events_or_read_the_bus(
    secured: tuple[str, Keys], admin: Any
) -> None:
    url, keys = secured
    errors: list[Exception] = []
    nc = await _engine(url, keys, errors)
    try:
        js = nc.jetstream()
        with pytest.raises(NatsTimeout):
            await js.publish("spec.run.x.completed", b"{}", timeout=2)
        await nc.subscribe("spec.>")
        await nc.flush()
        await asyncio.sleep(0.5)
    finally:
        await nc.close()
    refused = " ".join(str(e) for e in errors).lower()
    assert "permissions violation" in refused
    assert 'subscription to "spec.>"' in refused
    assert 'publish to "spec.run.x.completed"' in refused
    info = await admin.jetstream().stream_info(STREAM, subjects_filter="spec.run.>")
    assert not info.state.subjects  # nothing forged reached the stream
