"""What the gate's handler does with a `bench.completed`: read (db), decide (logic), gate
(runner), and store each verdict with its event in the outbox, in one transaction.

Candidate by candidate, so a process that dies mid-bench resumes with the candidates it
had not gated yet; a verdict stored already is not gated again (`logic.to_gate`), which
makes a redelivered bench safe without an inbox. See logic.py for what is published when.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from specbus import outbox
from specbus.envelope import Envelope
from speccore.model_cache import ModelLoadError
from specops_schemas.candidates import GateOutcome
from specops_schemas.events import BenchCompleted
from specops_services.quality_gate import db, logic, projection
from specops_services.quality_gate.runner import GateRunner
from specplatform.db import Pool

log = logging.getLogger(__name__)


async def gate_bench(pool: Pool, runner: GateRunner, event: Envelope[BenchCompleted]) -> None:
    """Gate every measured candidate of the bench that has no stored verdict yet."""
    bench = event.payload
    async with pool.connection() as conn:
        todo = logic.to_gate(bench, await db.stored_outcomes(conn, bench.bench_id))
    if not todo:
        log.info("bench %s: no measured candidate left to gate", bench.bench_id)
        return
    await queue(pool, [logic.gating_started(event)])
    for candidate in todo:
        try:
            outcome = await asyncio.to_thread(
                runner.evaluate, bench.plan, candidate, tenant_id=event.tenant_id
            )
        except ModelLoadError as err:
            log.error("bench %s: %s", bench.bench_id, err)
            await queue(pool, [logic.target_unavailable(event, str(err))])
            return
        cid = candidate.candidate_id
        await save_verdict(pool, event, cid, outcome)
        log.info("bench %s: %s %s passed=%s", bench.bench_id, cid, outcome.method, outcome.passed)


async def save_verdict(
    pool: Pool, event: Envelope[BenchCompleted], candidate_id: str, outcome: GateOutcome
) -> None:
    """Store a candidate's verdict and queue its `gate.evaluated`, unless one was stored already.

    The row is written from the event (`projection`), as a rebuild from the stream writes it.
    """
    verdict = logic.gate_evaluated(event, candidate_id, outcome)
    async with pool.connection() as conn, conn.transaction():
        if await projection.project(conn, verdict):
            await outbox.add(conn, verdict)


async def queue(pool: Pool, events: Sequence[Envelope[Any]]) -> None:
    """Queue events in a transaction of their own (ids derived, so queueing twice is a no-op)."""
    async with pool.connection() as conn, conn.transaction():
        for event in events:
            await outbox.add(conn, event)
