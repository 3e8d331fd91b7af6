"""The migration runner and 001_core.sql against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest

from specops_schemas import MIGRATIONS
from specplatform.db import MigrationError, connect, create_pool, migrate, tenant_transaction


def _copy_migrations(tmp_path: Path) -> Path:
    directory = tmp_path / "sql"
    shutil.copytree(MIGRATIONS, directory)
    return directory


def _applied(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]


async def test_migrations_apply_once_even_when_started_concurrently(empty_db: str) -> None:
    names = [p.stem for p in sorted(MIGRATIONS.glob("*.sql"))]
    # Replicas of a service all migrate at start; the advisory lock lets one apply.
    results = await asyncio.gather(*(migrate(empty_db, MIGRATIONS) for _ in range(4)))
    assert sorted(results, key=len)[-1] == names
    assert sum(len(r) for r in results) == len(names)
    assert await migrate(empty_db, MIGRATIONS) == []
    assert _applied(empty_db) == names


async def test_edited_applied_migration_is_refused(empty_db: str, tmp_path: Path) -> None:
    directory = _copy_migrations(tmp_path)
    await migrate(empty_db, directory)
    core = directory / "001_core.sql"
    core.write_text(core.read_text() + "\n-- an innocent-looking edit\n")
    with pytest.raises(MigrationError, match="001_core.sql changed after it was applied"):
        await migrate(empty_db, directory)


async def test_new_migration_applies_and_a_failing_one_leaves_no_trace(empty_db: str, tmp_path: Path) -> None:
    directory = _copy_migrations(tmp_path)
    await migrate(empty_db, directory)
    (directory / "900_bad.sql").write_text("CREATE TABLE half_done (x int);\nSELECT no_such_function();\n")
    with pytest.raises(MigrationError, match="900_bad.sql failed"):
        await migrate(empty_db, directory)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)
    (directory / "900_bad.sql").write_text("CREATE TABLE half_done (x int);\n")
    assert await migrate(empty_db, directory) == ["900_bad"]


async def test_unreachable_database_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="cannot connect"):
        await migrate(f"postgresql://postgres@/nope?host={tmp_path}", MIGRATIONS)


def _rep(conn: psycopg.Connection, *, on_conflict: str = "") -> int:
    cursor = conn.execute(
        "INSERT INTO bench_results (bench_id, candidate_id, rep, run_id, metrics, tokens_per_s) "
        f"VALUES ('b1', 'ngram-k5', 0, 'r1', '{{}}', 20.5) {on_conflict}"
    )
    return cursor.rowcount


def test_a_rep_is_stored_once(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        assert _rep(conn) == 1
        # What a restarted benchmark-runner does with a rep it measured again.
        assert _rep(conn, on_conflict="ON CONFLICT (bench_id, candidate_id, rep) DO NOTHING") == 0
        with pytest.raises(psycopg.errors.UniqueViolation):
            _rep(conn)


def _audit(conn: psycopg.Connection, payload: bytes) -> tuple[int, bytes, bytes]:
    row = conn.execute(
        "INSERT INTO audit_log (event_id, subject, type, tenant_id, payload) "
        "VALUES (%s, 'spec.run.r1.queued', 'run.queued', 't1', %s) RETURNING seq, prev_hash, hash",
        (uuid.uuid4(), payload),
    ).fetchone()
    assert row is not None
    return row


def test_audit_log_rows_chain_in_seq_order(db: str) -> None:
    # The row hash formula belongs to the audit service (004_audit.sql); the table
    # guarantees the links: each row's prev_hash is the hash of the row before it.
    with psycopg.connect(db, autocommit=True) as conn:
        rows = [_audit(conn, payload) for payload in (b'{"a":1}', b'{"b":2}', b'{"c":3}')]
    assert [seq for seq, _, _ in rows] == sorted(seq for seq, _, _ in rows)
    assert [prev for _, prev, _ in rows] == [bytes(32)] + [digest for _, _, digest in rows[:-1]]


@pytest.mark.parametrize(
    "statement",
    ["UPDATE audit_log SET tenant_id = 'other'", "DELETE FROM audit_log", "TRUNCATE audit_log"],
)
def test_audit_log_is_append_only(db: str, statement: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        _audit(conn, b"{}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute(statement)
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (1,)


async def test_a_tenant_transaction_sees_only_its_tenant(db: str) -> None:
    async with await connect(db, autocommit=True) as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme'), ('globex', 'Globex')")
        await conn.execute(
            "INSERT INTO runs (id, tenant_id, request) "
            "VALUES ('run-a', 'acme', '{}'), ('run-g', 'globex', '{}')"
        )
        await conn.execute(
            "INSERT INTO run_events (run_id, seq, event_id, type, payload, occurred_at) "
            "VALUES ('run-g', 1, gen_random_uuid(), 'run.queued', '{}', now())"
        )
    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        async with tenant_transaction(conn, "acme"):
            runs = await (await conn.execute("SELECT id FROM runs")).fetchall()
            events = await (await conn.execute("SELECT run_id FROM run_events")).fetchall()
        assert runs == [{"id": "run-a"}]
        assert events == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            async with tenant_transaction(conn, "acme"):
                await conn.execute(
                    "INSERT INTO runs (id, tenant_id, request) VALUES ('sneaky', 'globex', '{}')"
                )
        # The scope ended with its transaction: the pooled connection sees no tenant's runs.
        cursor = await conn.execute("SELECT count(*) AS n FROM runs")
        assert await cursor.fetchone() == {"n": 0}


def test_hardware_profiles_are_seeded(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM hardware_profiles")}
    assert {"H100-80GB", "H200", "A100-80GB", "L40S", "cpu"} <= names
