"""The gateway's Prometheus instruments, in the default registry (served on `/metrics` by
`specplatform.ops`): its HTTP requests by route template and status, and every tenant's runs
by state, counted from its read model.

The runs are counted by a background task every `gateway_metrics_refresh_s` and the gauge
holds the last count: a scrape reads numbers, never the database.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable

import psycopg
from prometheus_client import Counter, Gauge, Histogram
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specops_schemas.catalog import RunStatus
from specops_services.gateway import runs
from specplatform.db import Pool, role_transaction

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "specops_http_requests",
    "HTTP requests answered by the gateway, by method, route template and status.",
    ("method", "route", "status"),
)
REQUEST_SECONDS = Histogram(
    "specops_http_request_duration_seconds",
    "Time from a request's arrival to the start of its response (an event stream: to its headers).",
    ("method", "route"),
)
RUNS = Gauge(
    "specops_runs_by_state",
    "Runs of every tenant in each state, as last counted from the gateway's runs table.",
    ("state",),
)

# The route label of a path no route serves: its own path would make a label per probe.
UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RouteTemplates:
    """Names a request's route by the path template the app documents for it (an OpenAPI path
    such as `/v1/runs/{run_id}`), read once at the first request, when every route is in."""

    def __init__(self, templates: Callable[[], Iterable[str]]) -> None:
        self._templates = templates
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def name(self, path: str) -> str:
        """The template `path` matches, else UNMATCHED."""
        if self._compiled is None:
            self._compiled = [(compile_path(template)[0], template) for template in self._templates()]
        for regex, template in self._compiled:
            if regex.match(path):
                return template
        return UNMATCHED


class HttpMetrics:
    """ASGI middleware: counts every HTTP request by method, route template and status, and
    times it to the start of its response. Outermost, so a refused body (413) counts too."""

    def __init__(self, app: ASGIApp, templates: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.routes = RouteTemplates(templates)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in _METHODS else "other"
        route = self.routes.name(scope["path"])
        started = time.monotonic()
        answered = False

        def count(status: int) -> None:
            nonlocal answered
            answered = True
            REQUEST_SECONDS.labels(method, route).observe(time.monotonic() - started)
            REQUESTS.labels(method, route, str(status)).inc()

        async def measured(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Counted as it starts: an event stream open for an hour is a request now.
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, measured)
        finally:
            if not answered:
                # An exception that escaped the app: a 500 is sent further out.
                count(500)


def record_runs(counts: dict[RunStatus, int]) -> None:
    """Set the gauge of every state, 0 for a state with no run."""
    for state in RunStatus:
        RUNS.labels(state.value).set(counts.get(state, 0))


async def count_runs(pool: Pool, *, every_s: float) -> None:
    """Recount the runs by state every `every_s`, forever; cancel to stop. While the database
    is unreachable the gauge keeps its last count (the outage is logged by the requests)."""
    while True:
        try:
            async with pool.connection() as conn, role_transaction(conn, runs.RUN_MONITOR):
                record_runs(await runs.count_runs_by_status(conn))
        except psycopg.OperationalError:
            pass
        except psycopg.Error as exc:
            log.warning("could not count the runs by state: %r", exc)
        await asyncio.sleep(every_s)
