"""The ops endpoints of every service process: `GET /metrics` and `GET /healthz`.

A small HTTP server on its own daemon thread, separate from the service's event loop,
so that a scrape or a probe is answered even while the loop is busy or blocked waiting
for Postgres or NATS. It listens on `SPECOPS_METRICS_PORT` (unset: no server); the port
is per process (`specops up` picks a free one for each replica, a container uses 9464),
so it is read from the process's environment, never from the shared runtime.env.

- `/metrics`: the prometheus text of the default registry, where any module defines
  its metrics.
- `/healthz`: 200 `{"status": "ok", "checks": {...}}` when every registered check
  passes, else 503 `{"status": "unhealthy", ...}` with the same map. A check is a cheap
  synchronous callable the process supplies (it runs on the HTTP thread): whether the
  broker's connection is up, or the last result of a `DatabaseProbe` that an asyncio
  task refreshes, so a probe never waits on the async pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socketserver
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from faststream.nats import NatsBroker
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from specbus.tasks import cancel_until_done
from specplatform.db import unreachable
from specplatform.settings import Settings

log = logging.getLogger(__name__)

HealthCheck = Callable[[], bool]
# What a probe client reads: the check names of the shared contract.
NATS_CHECK = "nats"
DATABASE_CHECK = "database"
DATABASE_PROBE_INTERVAL_S = 5.0

_StartResponse = Callable[..., Any]


def process_ops_address() -> tuple[str, int] | None:
    """This process's ops host and port from its environment (SPECOPS_METRICS_HOST/PORT); None: no server."""
    own = Settings()
    return None if own.metrics_port is None else (own.metrics_host, own.metrics_port)


@dataclass(slots=True)
class OpsServer:
    """`/metrics` and `/healthz` on `host:port` (port 0: any free port, see `bound_port`)."""

    port: int
    host: str = "127.0.0.1"
    checks: dict[str, HealthCheck] = field(default_factory=dict)
    _server: WSGIServer | None = None
    _thread: threading.Thread | None = None

    def health(self) -> dict[str, bool]:
        results = {}
        for name, check in list(self.checks.items()):
            try:
                results[name] = bool(check())
            except Exception:  # a broken check is a failing one, never a 500
                log.exception("health check %s raised", name)
                results[name] = False
        return results

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise RuntimeError("the ops server is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._server = make_server(
            self.host, self.port, self._app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"ops-http-{self.port}", daemon=True
        )
        self._thread.start()
        log.info("ops endpoints at http://%s:%d/metrics and /healthz", self.host, self.bound_port)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    def _app(self, environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _respond(start_response, "405 Method Not Allowed", "text/plain", b"GET only\n")
        if path == "/metrics":
            return _respond(start_response, "200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
        if path == "/healthz":
            checks = self.health()
            ok = all(checks.values())
            body = json.dumps({"status": "ok" if ok else "unhealthy", "checks": checks}).encode()
            status = "200 OK" if ok else "503 Service Unavailable"
            return _respond(start_response, status, "application/json", body)
        return _respond(start_response, "404 Not Found", "text/plain", b"/metrics or /healthz\n")


def _respond(start_response: _StartResponse, status: str, content_type: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    # A slow scraper must not hold up a probe, nor keep the process from exiting.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        # One line per scrape every few seconds would bury the service's own log.
        return None


def broker_connected(broker: NatsBroker) -> HealthCheck:
    """Whether `broker`'s NATS connection is up now (False before its first connect)."""

    def check() -> bool:
        connection = broker._connection
        return connection is not None and bool(connection.is_connected)

    return check


@dataclass(slots=True)
class DatabaseProbe:
    """The result of a recent `SELECT 1` on its own short connection, refreshed by `run`.

    Its own connection rather than the service's pool: a pool busy with work (every
    connection checked out) is not a database that is down.
    """

    dsn: str
    interval_s: float = DATABASE_PROBE_INTERVAL_S
    ok: bool = False

    def __call__(self) -> bool:
        return self.ok

    async def run(self) -> None:
        while True:
            self.ok = await unreachable(self.dsn) is None
            await asyncio.sleep(self.interval_s)


@dataclass(slots=True)
class ProcessOps:
    """What a service process runs for its ops endpoints: the server and the database probe."""

    server: OpsServer
    probe: DatabaseProbe
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.probe.run(), name="database-probe")
        self.server.start()

    async def stop(self) -> None:
        self.server.stop()
        if self._task is not None:
            await cancel_until_done([self._task])
            self._task = None


def process_ops(broker: NatsBroker, dsn: str) -> ProcessOps | None:
    """The ops endpoints of a service on `broker` and the database `dsn`, at the address of
    `process_ops_address`; None when this process has no ops port."""
    address = process_ops_address()
    if address is None:
        return None
    host, port = address
    probe = DatabaseProbe(dsn)
    checks: dict[str, HealthCheck] = {NATS_CHECK: broker_connected(broker), DATABASE_CHECK: probe}
    return ProcessOps(OpsServer(port, host=host, checks=checks), probe)
