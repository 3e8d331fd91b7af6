"""The toy service's process: one handler, on run.completed, that logs the run."""

from __future__ import annotations

import logging

from faststream.nats import NatsBroker

from specbus import subscriber
from specbus.envelope import Envelope
from specops_schemas.events import RunCompleted, RunRunning
from specplatform.db import Pool
from specplatform.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "toy"
PUBLISHES = (RunRunning,)


def subscribe(broker: NatsBroker, pool: Pool) -> None:
    """Register the toy's handler (durable consumer `toy-noted`) on `broker`."""

    @subscriber(broker, service=SERVICE, events=RunCompleted)
    async def noted(event: Envelope[RunCompleted]) -> None:
        log.info("run %s completed", event.payload.run_id)


def serve(settings: Settings | None = None) -> None:
    """`specops serve toy`: says what it was given and returns (no servers in a unit test)."""
    print(f"toy served, state dir {settings.state_dir if settings else None}")
