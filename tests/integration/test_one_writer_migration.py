"""007_one_writer against a real PostgreSQL: runs in flight when it ships keep what the
predictor knew of them through tables it no longer reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb
from pydantic import TypeAdapter

from specops_schemas import MIGRATIONS
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import GateMethod
from specplatform.db import migrate


def _bench(conn: psycopg.Connection[tuple[object, ...]], run_id: str, *, finalized: bool = False) -> None:
    conn.execute(
        """INSERT INTO benches (bench_id, run_id, tenant_id, request, plan, baseline, results, completed_at,
               finalized_at)
           VALUES (%s, %s, 'acme', '{}', '{}', %s, %s, %s, %s)""",
        (
            f"bench-{run_id}",
            run_id,
            Jsonb({}) if finalized else None,
            Jsonb([]) if finalized else None,
            "now" if finalized else None,
            "now" if finalized else None,
        ),
    )


async def test_runs_in_flight_keep_their_verdicts_and_their_end(empty_db: str, tmp_path: Path) -> None:
    before = tmp_path / "sql"
    before.mkdir()
    for path in sorted(MIGRATIONS.glob("*.sql")):
        if path.name < "007":
            shutil.copy(path, before)
    await migrate(empty_db, before)

    with psycopg.connect(empty_db) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')")
        for run_id, status in (("measuring", "running"), ("answered", "running"), ("done", "completed")):
            result = Jsonb({}) if status == "completed" else None
            conn.execute(
                "INSERT INTO runs (id, tenant_id, status, request, result) VALUES (%s, 'acme', %s, '{}', %s)",
                (run_id, status, result),
            )
        _bench(conn, "measuring")
        _bench(conn, "answered", finalized=True)
        conn.execute(
            """INSERT INTO gate_results (bench_id, candidate_id, run_id, method, passed, score, threshold)
               VALUES ('bench-measuring', 'a', 'measuring', 'topk5', true, 0.99, 0.95),
                      ('bench-measuring', 'b', 'measuring', 'pending', NULL, NULL, NULL)"""
        )

    await migrate(empty_db, MIGRATIONS)

    with psycopg.connect(empty_db) as conn:
        ended = dict(conn.execute("SELECT run_id, ended_at IS NOT NULL FROM predictor_runs").fetchall())
        [(verdicts,)] = conn.execute("SELECT verdicts FROM benches WHERE run_id = 'measuring'").fetchall()
        [(none,)] = conn.execute("SELECT verdicts FROM benches WHERE run_id = 'answered'").fetchall()
    assert ended == {"measuring": False, "answered": True, "done": True}
    assert TypeAdapter(dict[str, GateOutcome]).validate_python(verdicts) == {
        "a": GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95),
        "b": GateOutcome(method=GateMethod.PENDING, passed=None),
    }
    assert none == {}
