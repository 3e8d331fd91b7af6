"""`specops init` and `specops health` (specops/commands/deploy.py) on real NATS and Postgres."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psycopg
import pytest

from specops.cli import main
from specops_schemas import MIGRATIONS


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nats_url: str, database_url: str) -> None:
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.setenv("DATABASE_URL", database_url)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _applied(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT count(*) FROM schema_migrations")
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


@pytest.mark.usefixtures("servers")
def test_init_migrates_an_empty_database(
    monkeypatch: pytest.MonkeyPatch, empty_db: str, own_nats_url: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", empty_db)
    monkeypatch.setenv("NATS_URL", own_nats_url)
    assert main(["init"]) == 0
    assert asyncio.run(_applied(empty_db)) == len(list(MIGRATIONS.glob("*.sql")))
    assert main(["init"]) == 0


@pytest.mark.usefixtures("servers")
def test_health_passes_when_both_answer() -> None:
    assert main(["health"]) == 0


@pytest.mark.usefixtures("servers")
def test_health_names_what_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{_closed_port()}")
    assert main(["health", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unhealthy: nats: ") and "postgres" not in err
