"""Whether the database answers, and waiting until it does (a service started before Postgres)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg.conninfo import conninfo_to_dict

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
WAIT_BASE_S = 0.5
WAIT_CAP_S = 5.0


def describe(dsn: str) -> str:
    """Where `dsn` points, without its credentials: `host:port/dbname` (host may be a socket dir)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DATABASE_URL>"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or ''}"


async def unreachable(dsn: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a fresh connection to `dsn` runs `SELECT 1` within `timeout_s`, else why not."""
    try:
        async with asyncio.timeout(timeout_s):
            conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, round(timeout_s)))
            async with conn:
                await conn.execute("SELECT 1")
    except TimeoutError:
        return f"no answer in {timeout_s:.0f}s"
    except (psycopg.Error, OSError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


async def wait_for_database(dsn: str, *, base_s: float = WAIT_BASE_S, cap_s: float = WAIT_CAP_S) -> None:
    """Return once `dsn` answers; until then retry with a backoff doubling up to `cap_s`, one
    log line per attempt. Never gives up: a supervised service waits for a late Postgres
    instead of exiting and being restarted in a loop."""
    delay = base_s
    while (error := await unreachable(dsn)) is not None:
        log.warning("waiting for postgres at %s (%s); retrying in %.1fs", describe(dsn), error, delay)
        await asyncio.sleep(delay)
        delay = min(cap_s, delay * 2)
