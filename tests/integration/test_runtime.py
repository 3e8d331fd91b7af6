"""`specops up / status / down` with the real embedded servers and stand-in services."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import psycopg
import pytest
from fixtures.postgres import server_tmpdir
from nats.js.api import RetentionPolicy

from specbus.subjects import STREAM
from specops.runtime.health import probe
from specops.runtime.nats_auth import Keys
from specops.runtime.ports import free_port, port_free
from specops.runtime.replicas import spawn
from specops.runtime.state import StateDir, terminate
from specops.runtime.supervisor import RuntimeStatus, ServerStatus, down, serve_command, status, up
from specplatform.errors import RuntimeSetupError
from specplatform.settings import Settings, load_settings

SERVICES = ("alpha", "beta")
GRACE_S = 0.3


def sleeper(service: str) -> list[str]:
    # Stands in for `specops serve <service>`: stays up until signalled.
    return [sys.executable, "-c", "import time; time.sleep(120)"]


def crasher(service: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; print('{service} cannot start: no config'); sys.exit(3)"]


@pytest.fixture
def settings() -> Iterator[Settings]:
    root = server_tmpdir("specops-test-state-")
    # Explicit None: a NATS_URL/DATABASE_URL in the developer's shell must not leak in.
    configured = Settings(state_dir=root / "state", nats_url=None, database_url=None)
    try:
        yield configured
    finally:
        down(configured)
        shutil.rmtree(root, ignore_errors=True)


def _alive(settings: Settings) -> dict[str, int]:
    result = status(settings)
    named = {s.name: s.pid for s in result.servers if s.alive and s.pid is not None}
    return named | {f"{p.service}[{p.replica}]": p.pid for p in result.processes if p.alive}


async def _stream_config(
    url: str, seed: str | None = None
) -> tuple[RetentionPolicy | None, float | None, float]:
    credentials = {"nkeys_seed": seed} if seed else {}
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **credentials)
    try:
        info = await nc.jetstream().stream_info(STREAM)
        return info.config.retention, info.config.max_age, info.config.duplicate_window
    finally:
        await nc.close()


def test_up_status_down(settings: Settings) -> None:
    result = up(settings, {"alpha": 2, "beta": 1}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    running = _alive(settings)
    assert set(running) == {"nats", "postgres", "alpha[0]", "alpha[1]", "beta[0]"}

    # Services started by hand find the servers through the state dir.
    discovered = load_settings(settings.state_dir)
    servers = {s.name: s for s in result.servers}
    assert discovered.nats_url == servers["nats"].url
    assert discovered.database_url == servers["postgres"].url
    assert (settings.state_dir / "logs" / "alpha-1.log").is_file()

    # The embedded server takes nkey users only; runtime.env names the admin's seed.
    with pytest.raises(nats.errors.Error):
        asyncio.run(_stream_config(servers["nats"].url))
    assert discovered.nats_nkey_seed_file == settings.state_dir / "nats" / "keys" / "admin.nk"
    seed = str(discovered.nats_nkey_seed_file)
    retention, max_age, window = asyncio.run(_stream_config(servers["nats"].url, seed))
    assert retention == RetentionPolicy.LIMITS
    assert max_age is not None and max_age >= 365 * 24 * 3600
    assert window == 120
    with psycopg.connect(servers["postgres"].url) as conn:
        migrated = conn.execute("SELECT name FROM schema_migrations ORDER BY version").fetchone()
    assert migrated == ("001_core",)

    # A second up changes nothing.
    up(settings, {"alpha": 2, "beta": 1}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    assert _alive(settings) == running

    down(settings)
    after = status(settings)
    assert after.servers == [] and after.processes == []
    assert not (settings.state_dir / "runtime.env").exists()
    for pid in running.values():
        assert not _pid_running(pid)

    again = up(settings, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    assert [(s.name, s.alive) for s in again.servers] == [("nats", True), ("postgres", True)]
    with psycopg.connect(next(s.url for s in again.servers if s.name == "postgres")) as conn:
        assert conn.execute("SELECT count(*) FROM hardware_profiles").fetchone() == (5,)


def test_up_refills_dead_replicas_and_scales_down(settings: Settings) -> None:
    up(settings, {"alpha": 2, "beta": 1}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    before = _alive(settings)
    os.kill(before["alpha[1]"], signal.SIGKILL)
    # The stale record reads as dead (and the watcher may have replaced it already).
    _wait_until(lambda: _alive(settings).get("alpha[1]") != before["alpha[1]"])

    up(settings, {"alpha": 2, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    after = _alive(settings)
    assert set(after) == {"nats", "postgres", "alpha[0]", "alpha[1]"}
    assert after["alpha[0]"] == before["alpha[0]"] and after["nats"] == before["nats"]
    assert after["alpha[1]"] != before["alpha[1]"]
    assert not _pid_running(before["beta[0]"])
    # Whoever came first, the watcher or this `up`, the restart is on record.
    assert "alpha[1]" in {r.component for r in status(settings).restarts}


def test_a_service_that_exits_at_once_fails_up_with_its_last_words(settings: Settings) -> None:
    with pytest.raises(RuntimeSetupError, match=r"beta\[0\] exited right after starting: beta cannot start"):
        up(settings, {"alpha": 0, "beta": 1}, services=SERVICES, command=crasher, start_grace_s=GRACE_S)


def test_configured_nats_is_used_not_started_or_stopped(settings: Settings, own_nats_url: str) -> None:
    nats_url = own_nats_url
    external = settings.model_copy(update={"nats_url": nats_url})
    result = up(external, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    nats_status = next(s for s in result.servers if s.name == "nats")
    assert (nats_status.url, nats_status.embedded, nats_status.alive) == (nats_url, False, None)
    down(external)
    assert asyncio.run(_stream_config(nats_url))[0] == RetentionPolicy.LIMITS  # still reachable


def test_the_watcher_restarts_a_killed_replica_and_nats_where_they_were(settings: Settings) -> None:
    first = up(settings, {"alpha": 1, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    assert first.watcher is not None and first.watcher.alive
    nats_before = _server(first, "nats")
    before = _alive(settings)
    os.kill(before["alpha[0]"], signal.SIGKILL)
    os.kill(before["nats"], signal.SIGKILL)

    def replaced() -> bool:
        now = _alive(settings)
        return all(now.get(name) not in (None, before[name]) for name in ("alpha[0]", "nats"))

    _wait_until(replaced, timeout_s=30.0)
    after = status(settings, probe_health=False)
    nats_after = _server(after, "nats")
    assert (nats_after.url, nats_after.monitor_url) == (nats_before.url, nats_before.monitor_url)
    assert {r.component for r in after.restarts} >= {"alpha[0]", "nats"}
    assert all(r.error is None for r in after.restarts)
    watch_log = (settings.state_dir / "logs" / "watch.log").read_text()
    assert "restarted alpha[0]" in watch_log and f"restarted nats at {nats_before.url}" in watch_log
    # The same users and the same JetStream store: the stream is still there.
    seed = str(load_settings(settings.state_dir).nats_nkey_seed_file)
    assert asyncio.run(_stream_config(nats_after.url, seed))[0] == RetentionPolicy.LIMITS

    again = up(settings, {"alpha": 1, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    assert again.watcher is not None and again.watcher.pid == first.watcher.pid
    down(settings)
    assert not _pid_running(first.watcher.pid)


def test_the_watcher_restarts_postgres_at_the_same_url(settings: Settings) -> None:
    first = up(settings, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    postgres = _server(first, "postgres")
    assert postgres.pid is not None
    os.kill(postgres.pid, signal.SIGKILL)
    _wait_until(lambda: _alive(settings).get("postgres") not in (None, postgres.pid), timeout_s=60.0)
    assert _server(status(settings), "postgres").url == postgres.url
    with psycopg.connect(postgres.url) as conn:
        assert conn.execute("SELECT count(*) FROM hardware_profiles").fetchone() == (5,)


def test_nats_is_restarted_on_its_port_or_not_at_all(settings: Settings) -> None:
    first = up(settings, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    nats_before = _server(first, "nats")
    assert first.watcher is not None and nats_before.pid is not None
    # Without the watcher, so that `up` meets the dead server itself.
    os.kill(first.watcher.pid, signal.SIGKILL)
    os.kill(nats_before.pid, signal.SIGKILL)
    _wait_until(lambda: "nats" not in _alive(settings))
    port = int(nats_before.url.rsplit(":", 1)[1])
    # The killed server's sockets may outlive its pid for a moment on a busy host; a squatter
    # that could not bind then would leave the port free again by the time `up` looks.
    _wait_until(lambda: port_free(port), timeout_s=30.0)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(RuntimeSetupError, match=f"cannot restart on 127.0.0.1:{port}"):
            up(settings, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    _wait_until(lambda: port_free(port), timeout_s=30.0)
    again = up(settings, {"alpha": 0, "beta": 0}, services=SERVICES, command=sleeper, start_grace_s=GRACE_S)
    assert _server(again, "nats").url == nats_before.url and _server(again, "nats").alive


def test_a_service_started_before_postgres_waits_for_it(settings: Settings) -> None:
    first = up(settings, {"audit": 0}, services=("audit",), start_grace_s=GRACE_S)
    postgres = _server(first, "postgres")
    assert first.watcher is not None and postgres.pid is not None
    # Without the watcher, so that Postgres stays down until `up`.
    os.kill(first.watcher.pid, signal.SIGKILL)
    os.kill(postgres.pid, signal.SIGINT)
    _wait_until(lambda: "postgres" not in _alive(settings), timeout_s=30.0)

    state_dir = StateDir(settings.state_dir)
    ops_port = free_port()
    env = {
        "NATS_URL": _server(first, "nats").url,
        "DATABASE_URL": postgres.url,
        "NATS_NKEY_SEED_FILE": str(Keys(settings.state_dir).seed_file("audit")),
        "SPECOPS_METRICS_PORT": str(ops_port),
    }
    record, proc = spawn(state_dir, service="audit", replica=0, argv=serve_command("audit"), env=env)
    try:
        _wait_until(lambda: "waiting for postgres at" in Path(record.log).read_text(), timeout_s=60.0)
        waiting = probe(ops_port)
        assert waiting.checks.get("database") is False and not waiting.healthy
        assert proc.poll() is None

        up(settings, {"audit": 0}, services=("audit",), start_grace_s=GRACE_S)
        _wait_until(lambda: probe(ops_port).healthy, timeout_s=60.0)
        assert proc.poll() is None
    finally:
        terminate(record.process, group=True)


def _server(result: RuntimeStatus, name: str) -> ServerStatus:
    return next(s for s in result.servers if s.name == name)


def _wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s")
        time.sleep(0.05)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie no one reaped (containers often lack an init that does) has exited.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
