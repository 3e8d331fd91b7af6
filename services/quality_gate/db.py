"""SQL of the quality gate: the verdicts of a bench (gate_results, schemas/sql/001_core.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from specops_schemas.candidates import GateOutcome

_STORED = """
    SELECT candidate_id, method, passed, score, threshold, details
    FROM gate_results WHERE bench_id = %s
"""
# A verdict is written once: a redelivered bench finds it and gates nothing again. Only
# a `pending` placeholder (passed NULL) is replaced, by a verdict.
_SAVE = """
    INSERT INTO gate_results
        (bench_id, candidate_id, run_id, method, passed, score, threshold, details, evaluated_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (bench_id, candidate_id) DO UPDATE SET
        method = EXCLUDED.method, passed = EXCLUDED.passed, score = EXCLUDED.score,
        threshold = EXCLUDED.threshold, details = EXCLUDED.details, evaluated_at = EXCLUDED.evaluated_at
    WHERE gate_results.passed IS NULL AND EXCLUDED.passed IS NOT NULL
    RETURNING candidate_id
"""


async def stored_outcomes(conn: AsyncConnection[Any], bench_id: str) -> dict[str, GateOutcome]:
    """The verdicts stored for a bench, by candidate_id."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_STORED, (bench_id,))
        rows = await cur.fetchall()
    return {row.pop("candidate_id"): GateOutcome.model_validate(row) for row in rows}


async def save_outcome(
    conn: AsyncConnection[Any],
    *,
    bench_id: str,
    run_id: str,
    candidate_id: str,
    outcome: GateOutcome,
    evaluated_at: datetime,
) -> bool:
    """Store a candidate's verdict reached at `evaluated_at`; False if one was stored already.

    A concurrent save of the same candidate (another replica) waits for the first
    transaction and then gets False if it committed.
    """
    params = (
        bench_id,
        candidate_id,
        run_id,
        outcome.method.value,
        outcome.passed,
        outcome.score,
        outcome.threshold,
        Jsonb(outcome.details),
        evaluated_at,
    )
    async with conn.cursor() as cur:
        await cur.execute(_SAVE, params)
        return await cur.fetchone() is not None
