"""Row-level security on a real PostgreSQL (schemas/sql/018_rls.sql, 022_rls_children.sql): every
table but a few that hold no tenant's data is bound by it, the services' role is not its owner
and cannot bypass it, a service connection sees a table's rows of its tenant only (none
without a tenant), and measured_history rows from before 018 are given to the tenant that
measured them."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from specops_schemas import MIGRATIONS
from specplatform.db import APP_ROLE, Connection, create_pool, migrate, role_transaction, tenant_transaction

# The roles a service ever runs as: its pool's, and the narrow cross-tenant ones it takes
# for one transaction (gateway, tuner, audit; `specops audit replay --rebuild` and `diff`).
SERVICE_ROLES = (
    APP_ROLE,
    "specops_token_reader",
    "specops_run_monitor",
    "specops_key_purger",
    "specops_tuner_ticker",
    "specops_audit_writer",
    "specops_audit_reader",
    "specops_rebuild_reader",
    "specops_session_keeper",
)

# The only tables without row-level security: they hold no tenant's rows (tenants lists
# them; the bus's inbox and outbox are every tenant's, read by each service's relay).
NOT_TENANT_SCOPED = {
    "tenants",
    "hardware_profiles",
    "inbox",
    "outbox",
    "audit_chain_head",
    "schema_migrations",
}

# One row of each tenant in every table with row-level security, parents first: a row of
# a table bound through its parent belongs to its tenant's parent (a bench's run_id is a
# run's id, or a tune session's).
SEED = {
    "runs": "INSERT INTO runs (id, tenant_id, request) VALUES ('run-' || %(x)s, %(t)s, '{}')",
    "run_events": """INSERT INTO run_events (run_id, seq, event_id, type, payload, occurred_at)
        VALUES ('run-' || %(x)s, 1, gen_random_uuid(), 'run.queued', '{}', now())""",
    "api_tokens": """INSERT INTO api_tokens (id, tenant_id, role, secret_sha256)
        VALUES ('tok-' || %(x)s, %(t)s, 'admin', repeat(%(x)s, 64))""",
    "console_sessions": """INSERT INTO console_sessions (id_sha256, token_id, tenant_id, expires_at)
        VALUES (repeat(%(x)s, 64), 'tok-' || %(x)s, %(t)s, now() + interval '1 hour')""",
    "idempotency_keys": """INSERT INTO idempotency_keys (tenant_id, key, request_hash, expires_at)
        VALUES (%(t)s, %(key)s, 'h', now() + %(expires)s::interval)""",
    "candidates": """INSERT INTO candidates (run_id, candidate_id, rank, family, candidate, prediction)
        VALUES ('run-' || %(x)s, 'c1', 1, 'ngram', '{}', '{}')""",
    "tune_sessions": """INSERT INTO tune_sessions (id, tenant_id, run_id, session, source)
        VALUES ('ts-' || %(x)s, %(t)s, 'run-' || %(x)s, '{}', '{}')""",
    "tune_session_events": """INSERT INTO tune_session_events
            (session_id, seq, event_id, type, payload, occurred_at)
        VALUES ('ts-' || %(x)s, 1, gen_random_uuid(), 'tune.started', '{}', now())""",
    "bench_results": """INSERT INTO bench_results (bench_id, candidate_id, rep, run_id, metrics, tokens_per_s)
        VALUES ('bench-' || %(x)s, 'c1', 0, %(measured)s, '{}', 1)""",
    "gate_results": """INSERT INTO gate_results (bench_id, candidate_id, run_id, method)
        VALUES ('bench-' || %(x)s, 'c1', %(measured)s, 'pending')""",
    "winner_cache": """INSERT INTO winner_cache
            (cache_scope, model_ref, gpu, engine, fingerprint, mode, quality_gate, candidates, measured)
        VALUES (%(t)s, 'm', 'cpu', 'speccore', 'chat', 'interactive', 'topk5', '[]', false)""",
    "measured_history": """INSERT INTO measured_history
            (tenant_id, family, fingerprint, temperature_bucket, k, acceptance_rate, speedup, model_ref, gpu)
        VALUES (%(t)s, 'ngram', 'chat', 'greedy', 3, 0.9, 2.0, 'm', 'cpu')""",
    "audit_log": """INSERT INTO audit_log (event_id, subject, type, tenant_id, payload)
        VALUES (gen_random_uuid(), 'spec.run.run-' || %(x)s || '.queued', 'run.queued', %(t)s, '{}')""",
    "benches": """INSERT INTO benches (bench_id, run_id, tenant_id, request, plan)
        VALUES ('bench-' || %(x)s, 'run-' || %(x)s, %(t)s, '{}', '{}')""",
    "predictor_runs": "INSERT INTO predictor_runs (run_id, tenant_id) VALUES ('run-' || %(x)s, %(t)s)",
    "tuner_sessions": """INSERT INTO tuner_sessions (session_id, tenant_id, request, space, seeded, budget_s,
            started_at, deadline, heartbeat_at)
        VALUES ('ts-' || %(x)s, %(t)s, '{}', '[]', 0, 60, now(), now(), now())""",
    "tuner_trials": """INSERT INTO tuner_trials (session_id, trial, bench_id, candidate, params, seeded)
        VALUES ('ts-' || %(x)s, 0, 'bench-t-' || %(x)s, '{}', '{}', false)""",
    "datastores": """INSERT INTO datastores (id, tenant_id, name, sha256, size_bytes, format, documents, path)
        VALUES ('ds-' || %(x)s, %(t)s, 'corpus', repeat(%(x)s, 64), 1, 'text', 1, 'p')""",
    "predictor_datastores": """INSERT INTO predictor_datastores (datastore_id, tenant_id, name, size_bytes)
        VALUES ('ds-' || %(x)s, %(t)s, 'corpus', 1)""",
    "head_data": """INSERT INTO head_data (tenant_id, sha256, size_bytes, examples, path)
        VALUES (%(t)s, repeat(%(x)s, 64), 1, 1, 'p')""",
    "heads": """INSERT INTO heads (id, tenant_id, target, family, head)
        VALUES ('head-' || %(x)s, %(t)s, 'm', 'medusa', '{}')""",
    "head_events": """INSERT INTO head_events (head_id, seq, event_id, type, payload, occurred_at)
        VALUES ('head-' || %(x)s, 1, gen_random_uuid(), 'head.requested', '{}', now())""",
    "speculative_head_approvals": """INSERT INTO speculative_head_approvals
            (head_id, tenant_id, event_id, from_state, to_state, actor, role, rationale, approved_at)
        VALUES ('head-' || %(x)s, %(t)s, gen_random_uuid(), 'uat', 'production', 'a', 'admin', '', now())""",
    "predictor_heads": """INSERT INTO predictor_heads
            (head_id, tenant_id, target_ref, family, state, transitioned_at)
        VALUES ('hd-' || repeat(%(x)s, 24), %(t)s, 'm', 'medusa', 'production', now())""",
    "security_policies": "INSERT INTO security_policies (tenant_id, version, policy) VALUES (%(t)s, 1, '{}')",
    "security_usage": """INSERT INTO security_usage (tenant_id, month)
        VALUES (%(t)s, date_trunc('month', now())::date)""",
    "security_head_usage": """INSERT INTO security_head_usage (tenant_id, head_id, counted_s)
        VALUES (%(t)s, 'head-' || %(x)s, 0)""",
    "gateway_security_policies": """INSERT INTO gateway_security_policies (tenant_id, version, policy)
        VALUES (%(t)s, 1, '{}')""",
    "gateway_budget_exhaustions": """INSERT INTO gateway_budget_exhaustions
            (tenant_id, month, budget_s, used_s, resets_at)
        VALUES (%(t)s, date_trunc('month', now())::date, 1, 1, now())""",
    "predictor_policies": """INSERT INTO predictor_policies (tenant_id, version, speculation_disabled)
        VALUES (%(t)s, 1, false)""",
    "tuner_policies": """INSERT INTO tuner_policies (tenant_id, version, speculation_disabled)
        VALUES (%(t)s, 1, false)""",
}
# acme's idempotency key is live, globex's expired; acme's bench measures a T1 run, globex's a tune session.
TENANTS = (
    {"t": "acme", "x": "a", "key": "live", "expires": "1 hour", "measured": "run-a"},
    {"t": "globex", "x": "b", "key": "old", "expires": "-1 hour", "measured": "ts-b"},
)


def _rls_tables(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    rows = conn.execute(
        """SELECT relname FROM pg_class
           WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relrowsecurity
           ORDER BY relname"""
    ).fetchall()
    return [str(r[0]) for r in rows]


def _seed(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """A row of each of two tenants in every table of SEED, written as the migrating (owner) login."""
    conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme'), ('globex', 'Globex')")
    for statement in SEED.values():
        for tenant in TENANTS:
            conn.execute(statement, tenant)


async def _counts(conn: Connection, tables: list[str]) -> dict[str, int]:
    seen = {}
    for table in tables:
        cursor = await conn.execute(f"SELECT count(*) AS n FROM {table}")  # noqa: S608 (catalog names)
        seen[table] = (await cursor.fetchone() or {})["n"]
    return seen


def test_every_table_with_a_tenants_rows_is_forced_and_not_the_services_own(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        state = {
            str(r[0]): (r[1], r[2], str(r[3]))
            for r in conn.execute(
                """SELECT relname, relrowsecurity, relforcerowsecurity, pg_get_userbyid(relowner)
                   FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"""
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
    tables = sorted(set(state) - NOT_TENANT_SCOPED)
    # Those bound through a parent (a bench's rows, a tuner's trials) as well.
    bound = {"runs", "audit_log", "predictor_heads", "bench_results", "gate_results", "tuner_trials"}
    assert bound <= set(tables)
    assert {t: state[t][:2] for t in tables} == {t: (True, True) for t in tables}
    assert set(tables) <= isolated
    owners = {state[t][2] for t in tables}
    assert owners.isdisjoint(SERVICE_ROLES)
    assert roles == {role: (False, False) for role in SERVICE_ROLES}


async def test_a_service_connection_runs_as_the_services_role(db: str) -> None:
    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        cursor = await conn.execute("SELECT current_user AS who")
        assert await cursor.fetchone() == {"who": APP_ROLE}


async def test_a_service_connection_sees_its_tenants_rows_only_and_none_without_a_tenant(db: str) -> None:
    with psycopg.connect(db) as conn:
        _seed(conn)
        tables = _rls_tables(conn)
        stored = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # type: ignore[index]  # noqa: S608
    # Every table a tenant's rows live in is seeded, or the counts below would prove nothing.
    assert sorted(SEED) == tables
    assert stored == dict.fromkeys(tables, 2)
    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        without = await _counts(conn, tables)
        await conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("INSERT INTO runs (id, tenant_id, request) VALUES ('no-tenant', 'acme', '{}')")
        await conn.rollback()
        # A measurement is written for a run or tune session of the writer's tenant only.
        for measured in ("run-b", "ts-b", "run-nobody"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                async with tenant_transaction(conn, "acme"):
                    await conn.execute(
                        """INSERT INTO bench_results
                               (bench_id, candidate_id, rep, run_id, metrics, tokens_per_s)
                           VALUES ('bench-x', 'c1', 0, %s, '{}', 1)""",
                        (measured,),
                    )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            async with tenant_transaction(conn, "acme"):
                await conn.execute(
                    "INSERT INTO tuner_trials (session_id, trial, bench_id, candidate, params, seeded) "
                    "VALUES ('ts-b', 1, 'bench-x', '{}', '{}', false)"
                )
        async with tenant_transaction(conn, "acme"):
            acme = await _counts(conn, tables)
            cursor = await conn.execute("SELECT tenant_id FROM measured_history")
            acme_history = await cursor.fetchall()
        async with tenant_transaction(conn, "globex"):
            globex = await _counts(conn, tables)
    assert without == dict.fromkeys(tables, 0)
    assert acme == globex == dict.fromkeys(tables, 1)
    assert acme_history == [{"tenant_id": "acme"}]


async def test_each_narrow_role_sees_only_what_it_is_for(db: str) -> None:
    with psycopg.connect(db) as conn:
        _seed(conn)
        conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE id = 'tok-b'")

    async def ids(conn: Connection, role: str, query: str) -> list[str]:
        async with role_transaction(conn, role):
            rows = await (await conn.execute(query)).fetchall()
        return sorted(str(next(iter(r.values()))) for r in rows)

    async with create_pool(db, max_size=1) as pool, pool.connection() as conn:
        tokens = await ids(conn, "specops_token_reader", "SELECT id FROM api_tokens")
        runs = await ids(conn, "specops_run_monitor", "SELECT id FROM runs")
        purged = await ids(conn, "specops_key_purger", "DELETE FROM idempotency_keys RETURNING key")
        rebuilt = await ids(conn, "specops_rebuild_reader", "SELECT bench_id FROM bench_results")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await ids(conn, "specops_rebuild_reader", "SELECT tenant_id FROM measured_history")
    assert tokens == ["tok-a"]  # live tokens only
    assert runs == ["run-a", "run-b"]  # every tenant's, to find the stalled ones
    assert purged == ["old"]  # the expired key only, whatever the DELETE asks
    assert rebuilt == ["bench-a", "bench-b"]  # every tenant's rows of the tables a rebuild compares, no other
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
