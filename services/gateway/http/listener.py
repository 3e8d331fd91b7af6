"""Wakes open event streams when their run gets an event (LISTEN run_events, 003_gateway.sql).

Streams still poll; a notification only cuts the wait short, so a lost LISTEN
connection slows streams down to the poll interval and breaks nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

import psycopg

from specops_services.gateway.http import db as http_db
from specops_services.gateway.http.problems import first_line

log = logging.getLogger(__name__)

RECONNECT_S = 2.0


class RunEventsListener:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

    async def wait(self, run_id: str, *, timeout: float) -> None:
        """Return when `run_id` gets an event, or after `timeout` seconds."""
        event = asyncio.Event()
        self._waiters[run_id].add(event)
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # races with the timeout, which would keep a disconnected client's stream polling.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await event.wait()
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[run_id]

    def wake(self, run_id: str) -> None:
        for event in self._waiters.get(run_id, ()):
            event.set()

    async def run(self) -> None:
        """Listen forever, reconnecting every RECONNECT_S after errors; cancel to stop. An
        outage is logged twice, when the connection is lost and when it is back, not at
        every attempt in between."""
        lost = False
        while True:
            try:
                async with await http_db.listen_run_events(self.dsn) as conn:
                    if lost:
                        log.info("run_events listener reconnected")
                        lost = False
                    async for notify in conn.notifies():
                        self.wake(notify.payload)
            except psycopg.Error as exc:
                if not lost:
                    log.warning("run_events listener lost its connection, reconnecting: %s", first_line(exc))
                lost = True
            await asyncio.sleep(RECONNECT_S)
