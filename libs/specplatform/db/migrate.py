"""Apply the numbered SQL migrations of a directory to a database, once each, safely from many processes."""

from __future__ import annotations

from pathlib import Path

import psycopg

from specplatform.db.migrations import Migration, MigrationError, load, pending

# Any constant works as long as every specops process uses the same one: services call
# migrate() at start, so N replicas race for it and all but one wait.
_LOCK_KEY = 0x5EC0_0001

_HISTORY = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def migrate(dsn: str, directory: Path) -> list[str]:
    """Apply pending migrations in order; returns the names applied (empty when up to date).

    Each file runs in its own transaction together with its schema_migrations row, so
    a failing file leaves no trace and is retried on the next call.
    """
    available = load(directory)
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        raise MigrationError(f"cannot connect to the database: {_first_line(exc)}") from None
    async with conn:
        # Session-level lock: released by the unlock below or when the connection drops.
        await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            await conn.execute(_HISTORY)
            cursor = await conn.execute("SELECT version, checksum FROM schema_migrations")
            applied = {int(version): str(checksum) for version, checksum in await cursor.fetchall()}
            todo = pending(available, applied)
            for migration in todo:
                await _apply(conn, migration)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return [m.name for m in todo]


async def _apply(conn: psycopg.AsyncConnection, migration: Migration) -> None:
    try:
        async with conn.transaction():
            # No parameters: psycopg sends the file as one simple query, so it may hold
            # many statements and `%` needs no escaping.
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
    except psycopg.Error as exc:
        raise MigrationError(f"{migration.name}.sql failed: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
