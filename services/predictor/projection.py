"""How the predictor's `candidates` follow from the event it publishes: one function, live and in a rebuild.

A run's ranked candidates are exactly the list its `run.predicted` carries, so the
predictor stores them from that event in the transaction that queues it, and
`specops audit replay --rebuild` stores them from the same event on the SPEC stream.
"""

from __future__ import annotations

from typing import Any

from specbus.envelope import Envelope
from specops_schemas.events import RunPredicted
from specops_services.predictor import db


async def project(conn: db.Connection, event: Envelope[Any]) -> None:
    """Store the ranked candidates of a `run.predicted` (other events write nothing here)."""
    payload = event.payload
    if isinstance(payload, RunPredicted):
        await db.save_candidates(conn, payload.run_id, payload.candidates, created_at=event.occurred_at)
