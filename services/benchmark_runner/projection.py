"""How `bench_results` follows from the event the runner publishes: one function, live and in a rebuild.

A rep row is written from its `bench.rep_measured`, in the transaction that queues the
event, and `specops audit replay --rebuild` writes it from the same event on the SPEC
stream. The row's run is the event's correlation id: every event of a bench follows
its `bench.requested`, whose correlation is the run (or tune session) it serves.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from specbus.envelope import Envelope
from specops_schemas.events import BenchRepMeasured
from specops_services.benchmark_runner import db
from specops_services.benchmark_runner.protocol import RepRow


async def project(conn: AsyncConnection[Any], event: Envelope[Any]) -> bool:
    """Store the rep row of a `bench.rep_measured`; False if it was stored already (or not one)."""
    measured = event.payload
    if not isinstance(measured, BenchRepMeasured):
        return False
    row = RepRow(measured.candidate_id, measured.rep, measured.metrics, measured.speedup)
    return await db.insert_rep(
        conn,
        bench_id=measured.bench_id,
        run_id=event.correlation_id,
        row=row,
        recorded_at=event.occurred_at,
    )
