"""Async connections to the specops database (psycopg 3 + psycopg_pool)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

# The role RLS policies apply to (schemas/sql/001_core.sql); tables belong to the
# migrating role, which bypasses RLS as their owner.
APP_ROLE = "specops_app"

Pool = AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]
Connection = psycopg.AsyncConnection[DictRow]


def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, name: str = "specops", timeout_s: float = 30.0
) -> Pool:
    """An unopened pool of dict-row connections; use `async with create_pool(dsn) as pool:`.

    Unopened because AsyncConnectionPool must be opened inside a running event loop.
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
        open=False,
    )


async def connect(dsn: str, *, autocommit: bool = False) -> Connection:
    """One connection outside a pool (CLI commands, scripts)."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, row_factory=dict_row)


@asynccontextmanager
async def tenant_transaction(conn: Connection, tenant_id: str) -> AsyncIterator[Connection]:
    """A transaction that sees and writes only `tenant_id`'s rows of tenant-scoped tables.

    SET LOCAL / set_config(..., true) end with the transaction, so a pooled connection
    never carries one tenant's scope into another request.
    """
    async with conn.transaction():
        await conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
        await conn.execute("SELECT set_config('app.tenant_id', %s, true)", (tenant_id,))
        yield conn
