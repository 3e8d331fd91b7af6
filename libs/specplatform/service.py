"""The process of a bus service (`specops serve <service>`): what each one does on start and stop.

Start: the ops endpoints (specplatform.ops: /metrics, /healthz), then wait for the
database (a service may start before Postgres), apply the migrations, open the database
pool, start the broker (FastStream binds the durable consumers registered on it; its
first connect waits for NATS the way a reconnect does), then the outbox relay. Stop
(SIGTERM / SIGINT): the relay, the broker, then the pool, so nothing a handler or the
relay still uses is closed under it, and last the ops endpoints. The gateway is a FastAPI
app with a lifespan of its own instead.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import OutboxRelay
from specplatform.db import Pool, migrate, wait_for_database
from specplatform.ops import process_ops

log = logging.getLogger(__name__)

# A relay blocked in a publish or in LISTEN must not hold the process past its SIGTERM grace.
RELAY_STOP_S = 5.0


def service_app(
    broker: NatsBroker,
    pool: Pool,
    dsn: str,
    *,
    migrations: Path,
    outbox: bool = True,
    producer: str | None = None,
    logger: logging.Logger | None = None,
) -> FastStream:
    """The FastStream app of a service whose handlers are subscribed on `broker` already.

    `pool` is unopened (`specplatform.db.create_pool`) and `dsn` the database it connects to,
    brought up to date with the SQL files in `migrations` on start.
    `outbox`: run an OutboxRelay for the events the handlers commit (audit writes none).
    `producer`: the relay publishes only the events of this producer (the service's own:
    its NATS user may publish those subjects only).
    `logger`: FastStream's own log lines go there instead of to its default logger.
    """
    relay = OutboxRelay(pool, broker, producer=producer) if outbox else None
    options: dict[str, Any] = {} if logger is None else {"logger": logger}
    app = FastStream(broker, **options)
    ops = process_ops(broker, dsn)

    @app.on_startup
    async def open_database() -> None:
        if ops is not None:
            await ops.start()
        await wait_for_database(dsn)
        await migrate(dsn, migrations)
        await pool.open(wait=True)

    @app.after_startup
    async def start_relay() -> None:
        if relay is not None:
            await relay.start()

    @app.on_shutdown
    async def stop_relay() -> None:
        if relay is None:
            return
        try:
            await asyncio.wait_for(relay.stop(), RELAY_STOP_S)
        except TimeoutError:
            log.warning(
                "outbox relay did not stop in %.0fs; unpublished rows wait for the next start", RELAY_STOP_S
            )

    @app.after_shutdown
    async def close_database() -> None:
        await pool.close()
        if ops is not None:
            await ops.stop()

    return app
