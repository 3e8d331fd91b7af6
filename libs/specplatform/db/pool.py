"""Async connections to the specops database (psycopg 3 + psycopg_pool)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from specbus import tenancy

# The role every service connection runs as (schemas/sql/018_rls.sql): it owns no table and
# has no BYPASSRLS, so row-level security binds it; tables belong to the migrating role.
APP_ROLE = "specops_app"

Pool = AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]
Connection = psycopg.AsyncConnection[DictRow]

# psycopg_pool retries a failed connect with a backoff that doubles (1, 2, 4 ... s) until
# `reconnect_timeout`: after a minute-long outage its next try could be a minute away, and
# every request meanwhile waits out its PoolTimeout. Giving up after a few seconds instead
# leaves the pool short, and the next request that finds it empty starts a fresh attempt
# at once: a pool is usable again within seconds of Postgres returning.
RECONNECT_GIVE_UP_S = 2.0


def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, name: str = "specops", timeout_s: float = 30.0
) -> Pool:
    """An unopened pool of dict-row connections; use `async with create_pool(dsn) as pool:`.

    Every connection runs as APP_ROLE from the moment it is opened, whichever login the
    DSN names (the tables' owner, a superuser): a service sees a tenant's rows only in a
    `tenant_transaction` (or `specbus.process_once`), and another tenant's never.
    Unopened because AsyncConnectionPool must be opened inside a running event loop.
    A connection is checked (one empty round trip) before it is handed out, so one that
    died with the server (an outage, a restart) is replaced instead of failing a request.
    `timeout_s`: how long `pool.connection()` waits for a connection before PoolTimeout.
    """
    kwargs: dict[str, Any] = {"row_factory": dict_row}
    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout_s,
        kwargs=kwargs,
        connection_class=psycopg.AsyncConnection[DictRow],
        configure=_as_app_role,
        check=AsyncConnectionPool.check_connection,
        reconnect_timeout=RECONNECT_GIVE_UP_S,
        open=False,
    )


async def _as_app_role(conn: Connection) -> None:
    await conn.execute(f"SET ROLE {APP_ROLE}")
    await conn.commit()


async def connect(dsn: str, *, autocommit: bool = False) -> Connection:
    """One connection outside a pool (CLI commands, scripts)."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, row_factory=dict_row)


@asynccontextmanager
async def tenant_transaction(conn: Connection, tenant_id: str) -> AsyncIterator[Connection]:
    """A transaction that sees and writes only `tenant_id`'s rows of tenant-scoped tables.

    SET LOCAL / set_config(..., true) end with the transaction, so a pooled connection
    never carries one tenant's scope into another request. The role is set here too for
    connections from `connect` (the CLI's), which run as their login otherwise.
    """
    async with conn.transaction():
        await conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
        await tenancy.act_for(conn, tenant_id)
        yield conn


@asynccontextmanager
async def role_transaction(conn: Connection, role: str) -> AsyncIterator[Connection]:
    """A transaction run as `role`, one of the narrow roles that may see or write one kind of
    row of every tenant (a bearer token by its hash, the stalled runs, the expired
    idempotency keys, the audit log: schemas/sql/008_audit_role.sql, 018_rls.sql; the state
    a rebuild compares: 022_rls_children.sql), for back-end work that spans tenants. The
    only way specops code takes another role than APP_ROLE."""
    async with conn.transaction():
        await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        yield conn
