"""How `gate_results` follows from the event the gate publishes: one function, live and in a rebuild.

A verdict is written from its `gate.evaluated`, in the transaction that queues the
event, and `specops audit replay --rebuild` writes it from the same event on the SPEC
stream. The row's run is the event's correlation id (the bench's run or tune session).
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from specbus.envelope import Envelope
from specops_schemas.events import GateEvaluated
from specops_services.quality_gate import db


async def project(conn: AsyncConnection[Any], event: Envelope[Any]) -> bool:
    """Store the verdict of a `gate.evaluated`; False if one was stored already (or not one)."""
    verdict = event.payload
    if not isinstance(verdict, GateEvaluated):
        return False
    return await db.save_outcome(
        conn,
        bench_id=verdict.bench_id,
        run_id=event.correlation_id,
        candidate_id=verdict.candidate_id,
        outcome=verdict.outcome(),
        evaluated_at=event.occurred_at,
    )
