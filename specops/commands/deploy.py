"""`specops init` and `specops health`: the one-shot setup and the probe of a deployment's containers.

`init` brings the database and the streams to this release (the numbered migrations,
then `specops.runtime.stream.apply_stream_config`); compose runs it once before the
services, Kubernetes as a Job. Services create what is missing themselves, but only
`init` (like `specops up`) updates an existing stream to a changed configuration.

`health` is the probe of a bus service, which serves no HTTP: exit 0 when NATS (a round
trip, with the container's credentials) and Postgres answer within the timeout, 1 with
one line on stderr naming what did not. It checks what the container can reach, not the
service process itself; a process that dies ends its container.

Connections come from `specplatform.settings` (NATS_URL, NATS_NKEY_SEED_FILE or
NATS_CREDS_FILE, DATABASE_URL).
Wiring: `add_parsers(sub)` on the top-level subparsers; each parser sets `handler`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

EXIT_UNHEALTHY = 1


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `init` and `health` to the `specops` subcommands (`sub`)."""
    init = sub.add_parser("init", help="apply the migrations and the SPEC stream configuration (idempotent)")
    init.set_defaults(handler=run_init)
    health = sub.add_parser("health", help="exit 0 when NATS and Postgres answer, else 1")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds per check (default 3)")
    health.set_defaults(handler=run_health)


def run_init(args: argparse.Namespace) -> int:
    from specops.runtime.stream import apply_stream_config
    from specops_schemas import MIGRATIONS
    from specplatform.db import migrate
    from specplatform.settings import load_settings

    settings = load_settings()
    applied = asyncio.run(migrate(settings.require_database_url(), MIGRATIONS))
    print(
        f"migrations applied: {', '.join(applied)}" if applied else "database is up to date", file=sys.stderr
    )
    asyncio.run(apply_stream_config(settings.require_nats_url(), settings.nats_credentials()))
    print("streams configured", file=sys.stderr)
    return 0


def run_health(args: argparse.Namespace) -> int:
    from specplatform.settings import load_settings

    settings = load_settings()
    nats_url = settings.require_nats_url()
    problems = asyncio.run(
        _problems(nats_url, settings.nats_credentials(), settings.require_database_url(), args.timeout)
    )
    if problems:
        print(f"unhealthy: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_UNHEALTHY
    return 0


async def _problems(nats_url: str, credentials: dict[str, str], dsn: str, timeout_s: float) -> list[str]:
    checks = {"nats": _nats(nats_url, credentials, timeout_s), "postgres": _postgres(dsn, timeout_s)}
    results = await asyncio.gather(
        *(asyncio.wait_for(c, timeout_s) for c in checks.values()), return_exceptions=True
    )
    return [
        f"{name}: {_reason(result, timeout_s)}"
        for name, result in zip(checks, results, strict=True)
        if isinstance(result, BaseException)
    ]


def _reason(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer in {timeout_s:g}s"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def _nats(url: str, credentials: dict[str, str], timeout_s: float) -> None:
    import nats

    nc = await nats.connect(
        url,
        connect_timeout=timeout_s,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        # nats-py prints each failed attempt with its traceback; the probe says it in one line.
        error_cb=_quiet,
        **credentials,
    )
    try:
        # A round trip, which needs no permission: a service's user may not call the
        # JetStream API outside its own consumers (specops.runtime.nats_auth).
        await nc.flush(timeout=max(1, int(timeout_s)))
    finally:
        await nc.close()


async def _quiet(exc: Exception) -> None:
    return None


async def _postgres(dsn: str, timeout_s: float) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(timeout_s))) as conn:
        await conn.execute("SELECT 1")
