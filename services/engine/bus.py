"""The engine server's connection for the events it publishes (drift decisions, live workload
summaries): one NATS connection as the engine's user, opened from the server's event loop,
published on from any thread.

A publish is handed to the event loop and not awaited: the decision or summary it reports is
already taken, so a publish that fails is logged and the server goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from specbus import publish
from specbus.broker import inbox_prefix
from specbus.envelope import Envelope
from specbus.subjects import STREAM
from specplatform.settings import ENGINE_USER

log = logging.getLogger(__name__)

PRODUCER = "engine"


class EngineBus:
    def __init__(self, nats_url: str, server_id: str, credentials: Mapping[str, str] | None = None) -> None:
        self.nats_url = nats_url
        self.server_id = server_id
        self.credentials = dict(credentials or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Any = None

    async def start(self) -> None:
        import nats

        self._nc = await nats.connect(
            self.nats_url,
            name=f"engine-{self.server_id}",
            inbox_prefix=inbox_prefix(ENGINE_USER),
            **self.credentials,
        )
        # Only read: the runtime creates SPEC, the engine's user may not.
        await self._nc.jetstream().stream_info(STREAM)
        self._loop = asyncio.get_running_loop()
        log.info("events of server %s go to %s", self.server_id, self.nats_url)

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.drain()

    def publish(self, event: Envelope[Any]) -> None:
        """Publish ``event`` on JetStream from any thread; nothing before ``start``."""
        if self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(publish(self._nc.jetstream(), event), self._loop)
        future.add_done_callback(lambda done: _log_failure(done, event.type))


def _log_failure(future: Future[Any], event_type: str) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("could not publish a %s event: %s", event_type, future.exception())
