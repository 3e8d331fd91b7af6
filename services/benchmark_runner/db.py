"""SQL of the benchmark-runner: the rep rows of a bench (bench_results, schemas/sql/001_core.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from specops_schemas.events import RepMetrics
from specops_services.benchmark_runner.protocol import RepRow

_STORED = """
    SELECT candidate_id, rep, metrics, speedup FROM bench_results
    WHERE bench_id = %s ORDER BY rep, candidate_id
"""
# The unique key is what makes a rep stored (and so announced) once, whichever process
# or replica measured it.
_INSERT = """
    INSERT INTO bench_results
        (bench_id, candidate_id, rep, run_id, metrics, tokens_per_s, speedup, recorded_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT bench_results_one_per_rep DO NOTHING
"""
_PROCESSED = "SELECT 1 FROM inbox WHERE consumer = %s AND event_id = %s"


async def stored_reps(conn: AsyncConnection[Any], bench_id: str) -> list[RepRow]:
    """The rep rows already stored for a bench (by an earlier, interrupted delivery)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_STORED, (bench_id,))
        rows = await cur.fetchall()
    return [
        RepRow(r["candidate_id"], r["rep"], RepMetrics.model_validate(r["metrics"]), r["speedup"])
        for r in rows
    ]


async def insert_rep(
    conn: AsyncConnection[Any], *, bench_id: str, run_id: str, row: RepRow, recorded_at: datetime
) -> bool:
    """Store one rep row measured at `recorded_at`; False if that (bench, candidate, rep) was stored already.

    A concurrent insert of the same key (another replica) waits for the first
    transaction and then gets False if it committed.
    """
    metrics = row.metrics
    params = (
        bench_id,
        row.candidate_id,
        row.rep,
        run_id,
        Jsonb(metrics.model_dump(mode="json")),
        metrics.tokens_per_s,
        row.speedup,
        recorded_at,
    )
    cursor = await conn.execute(_INSERT, params)
    return cursor.rowcount == 1


async def processed(conn: AsyncConnection[Any], consumer: str, event_id: str) -> bool:
    """Whether `consumer` already finished this event (its inbox row is committed)."""
    cursor = await conn.execute(_PROCESSED, (consumer, event_id))
    return await cursor.fetchone() is not None
