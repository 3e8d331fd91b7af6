"""Row-level security on a real PostgreSQL (schemas/sql/018_rls.sql): every table with a
tenant_id is bound by it, the services' role is not its owner and cannot bypass it, a
service connection without a tenant sees no tenant's row, and measured_history rows from
before the migration are given to the tenant that measured them."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from specops_schemas import MIGRATIONS
from specplatform.db import APP_ROLE, Connection, create_pool, migrate, role_transaction, tenant_transaction

# The roles a service ever runs as: its pool's, and the narrow cross-tenant ones it takes
# for one transaction (gateway, tuner, audit).
SERVICE_ROLES = (
    APP_ROLE,
    "specops_token_reader",
    "specops_run_monitor",
    "specops_key_purger",
    "specops_tuner_ticker",
    "specops_audit_writer",
    "specops_audit_reader",
)


def _tenant_tables(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    rows = conn.execute(
        """SELECT c.table_name FROM information_schema.columns c
           JOIN information_schema.tables t USING (table_schema, table_name)
           WHERE c.table_schema = 'public' AND c.column_name = 'tenant_id' AND t.table_type = 'BASE TABLE'
           ORDER BY c.table_name"""
    ).fetchall()
    return [str(r[0]) for r in rows]


def _seed(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Rows of two tenants in tables of every service, written as the migrating (owner) login."""
    conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme'), ('globex', 'Globex')")
    conn.execute(
        "INSERT INTO runs (id, tenant_id, request) VALUES ('run-a', 'acme', '{}'), ('run-g', 'globex', '{}')"
    )
    conn.execute(
        "INSERT INTO api_tokens (id, tenant_id, role, secret_sha256) VALUES "
        "('tok-a', 'acme', 'admin', repeat('a', 64)), ('tok-g', 'globex', 'viewer', repeat('b', 64))"
    )
    conn.execute(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, expires_at) VALUES "
        "('acme', 'live', 'h', now() + interval '1 hour'), ('globex', 'old', 'h', now() - interval '1 hour')"
    )
    conn.execute(
        """INSERT INTO measured_history (tenant_id, family, fingerprint, temperature_bucket, k,
               acceptance_rate, speedup, model_ref, gpu)
           VALUES ('acme', 'ngram', 'chat', 'greedy', 3, 0.9, 2.0, 'm', 'cpu')"""
    )
    conn.execute(
        "INSERT INTO audit_log (event_id, subject, type, tenant_id, payload) "
        "VALUES (gen_random_uuid(), 'spec.run.run-a.queued', 'run.queued', 'acme', '{}')"
    )


def test_every_tenant_table_is_forced_and_not_the_services_own(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        # The winner cache is scoped by its cache_scope, the tenant.
        tables = [*_tenant_tables(conn), "winner_cache"]
        # The tables of every service, predictor's caches included.
        assert {"runs", "api_tokens", "audit_log", "measured_history", "predictor_heads"} <= set(tables)
        state = {
            str(r[0]): (r[1], r[2], str(r[3]))
            for r in conn.execute(
                """SELECT relname, relrowsecurity, relforcerowsecurity, pg_get_userbyid(relowner)
                   FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relname = ANY(%s)""",
                (tables,),
            )
        }
        isolated = {
            str(r[0])
            for r in conn.execute(
                "SELECT tablename FROM pg_policies WHERE policyname = 'tenant_isolation' AND %s = ANY(roles)",
                (APP_ROLE,),
            )
        }
        roles = {
            str(r[0]): (r[1], r[2])
            for r in conn.execute(
                "SELECT rolname, rolbypassrls, rolsuper FROM pg_roles WHERE rolname = ANY(%s)",
                (list(SERVICE_ROLES),),
            )
        }
    assert {t: state[t][:2] for t in tables} == {t: (True, True) for t in tables}
    assert set(tables) <= isolated
    owners = {state[t][2] for t in tables}
    assert owners.isdisjoint(SERVICE_ROLES)
    assert roles == {role: (False, False) for role in SERVICE_ROLES}


async def test_a_service_connection_runs_as_the_services_role(db: str) -> None:
    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        cursor = await conn.execute("SELECT current_user AS who")
        assert await cursor.fetchone() == {"who": APP_ROLE}


async def test_a_query_without_a_tenant_sees_nothing(db: str) -> None:
    with psycopg.connect(db) as conn:
        _seed(conn)
        tables = _tenant_tables(conn)
    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        seen = {}
        for table in tables:
            cursor = await conn.execute(f"SELECT count(*) AS n FROM {table}")  # noqa: S608 (catalog names)
            seen[table] = (await cursor.fetchone() or {})["n"]
        await conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("INSERT INTO runs (id, tenant_id, request) VALUES ('no-tenant', 'acme', '{}')")
        await conn.rollback()
        async with tenant_transaction(conn, "acme"):
            cursor = await conn.execute("SELECT tenant_id FROM measured_history")
            acme = await cursor.fetchall()
        async with tenant_transaction(conn, "globex"):
            cursor = await conn.execute("SELECT tenant_id FROM measured_history")
            globex = await cursor.fetchall()
    assert seen == dict.fromkeys(tables, 0)
    assert acme == [{"tenant_id": "acme"}] and globex == []


async def test_each_narrow_role_sees_only_what_it_is_for(db: str) -> None:
    with psycopg.connect(db) as conn:
        _seed(conn)
        conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE id = 'tok-g'")

    async def ids(conn: Connection, role: str, query: str) -> list[str]:
        async with role_transaction(conn, role):
            rows = await (await conn.execute(query)).fetchall()
        return sorted(str(next(iter(r.values()))) for r in rows)

    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        tokens = await ids(conn, "specops_token_reader", "SELECT id FROM api_tokens")
        runs = await ids(conn, "specops_run_monitor", "SELECT id FROM runs")
        purged = await ids(conn, "specops_key_purger", "DELETE FROM idempotency_keys RETURNING key")
    assert tokens == ["tok-a"]  # live tokens only
    assert runs == ["run-a", "run-g"]  # every tenant's, to find the stalled ones
    assert purged == ["old"]  # the expired key only, whatever the DELETE asks
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT key FROM idempotency_keys").fetchall() == [("live",)]


@pytest.mark.parametrize("tenants", [("acme",), ("acme", "globex")])
async def test_history_from_before_the_migration_keeps_its_tenant(
    empty_db: str, tmp_path: Path, tenants: tuple[str, ...]
) -> None:
    before = tmp_path / "sql"
    before.mkdir()
    for path in sorted(MIGRATIONS.glob("*.sql")):
        if path.name < "018":
            shutil.copy(path, before)
    await migrate(empty_db, before)
    with psycopg.connect(empty_db) as conn:
        for tenant in tenants:
            conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (tenant, tenant))
        last = tenants[-1]
        conn.execute("INSERT INTO runs (id, tenant_id, request) VALUES ('run-1', %s, '{}')", (last,))
        conn.execute(
            "INSERT INTO benches (bench_id, run_id, tenant_id, request, plan) "
            "VALUES ('b-0', 'run-0', 'acme', '{}', '{}')"
        )
        for run_id, bench_id in (("run-0", "b-0"), ("run-1", None), (None, None)):
            conn.execute(
                """INSERT INTO measured_history (family, fingerprint, temperature_bucket, k, acceptance_rate,
                       model_ref, gpu, run_id, bench_id)
                   VALUES ('ngram', 'chat', 'greedy', 3, 0.5, 'm', 'cpu', %s, %s)""",
                (run_id, bench_id),
            )

    await migrate(empty_db, MIGRATIONS)

    with psycopg.connect(empty_db) as conn:
        rows = conn.execute("SELECT run_id, tenant_id FROM measured_history ORDER BY id").fetchall()
    # By its bench, by its run; a row of no known run is the only tenant's, or no one's.
    untraced = [(None, "acme")] if len(tenants) == 1 else []
    assert rows == [("run-0", "acme"), ("run-1", last), *untraced]
