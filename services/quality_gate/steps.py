"""What the gate's handler does with a `bench.completed`: read (db), decide (logic), gate
(runner), and store each verdict with its event in the outbox, in one transaction.

Candidate by candidate, so a process that dies mid-bench resumes with the candidates it
had not gated yet; a verdict stored already is not gated again (`logic.to_gate`), which
makes a redelivered bench safe without an inbox. See logic.py for what is published when.
The verdicts are read and written acting for the bench's tenant: row-level security binds
them through the run or tune session they judge (schemas/sql/022_rls_children.sql).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from specbus import outbox
from specbus.envelope import Envelope
from specbus.inbox import claim
from speccore.errors import SpecError
from speccore.model_cache import ModelLoadError
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import BenchCompleted
from specops_schemas.heads import HeadTrained
from specops_services.quality_gate import db, logic, projection
from specops_services.quality_gate.heads import HeadUnusable
from specops_services.quality_gate.runner import GateRunner
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)


async def gate_bench(pool: Pool, runner: GateRunner, event: Envelope[BenchCompleted]) -> None:
    """Gate every measured candidate of the bench that has no stored verdict yet."""
    bench = event.payload
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        todo = logic.to_gate(bench, await db.stored_outcomes(conn, bench.bench_id))
    if not todo:
        log.info("bench %s: no measured candidate left to gate", bench.bench_id)
        return
    await queue(pool, [logic.gating_started(event)])
    measured = {m.candidate_id: m for m in bench.results}
    for candidate in todo:
        try:
            outcome = await asyncio.to_thread(
                runner.evaluate,
                bench.plan,
                candidate,
                tenant_id=event.tenant_id,
                measured=measured.get(candidate.candidate_id),
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
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        if await projection.project(conn, verdict):
            await outbox.add(conn, verdict)


async def queue(pool: Pool, events: Sequence[Envelope[Any]]) -> None:
    """Queue events in a transaction of their own (ids derived, so queueing twice is a no-op)."""
    async with pool.connection() as conn, conn.transaction():
        for event in events:
            await outbox.add(conn, event)


async def gate_head(pool: Pool, runner: GateRunner, consumer: str, event: Envelope[HeadTrained]) -> None:
    """Gate a trained head and queue its one verdict: head.gated, or head.failed when the
    target or the artifact cannot be loaded or no held-out prompt is there.

    The verdict's id is derived from the head and its artifact (logic.head_verdict_id) and
    claimed in the inbox with it: a redelivered head.trained that finds it claimed decodes
    nothing; one that raced a replica and lost drops its (possibly different) numbers."""
    trained = event.payload
    verdict_id = logic.head_verdict_id(trained)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT 1 FROM inbox WHERE consumer = %s AND event_id = %s", (consumer, verdict_id)
        )
        if await cur.fetchone() is not None:
            log.info("head %s: gated already; %s ignored", trained.head_id, event.event_id)
            return
    try:
        result = await asyncio.to_thread(runner.evaluate_head, trained, event.tenant_id)
        verdict: Envelope[Any] = logic.head_gated(event, result)
        log.info("head %s: passed=%s (%s)", trained.head_id, result.passed, result.reason)
    except ModelLoadError as err:
        verdict = logic.head_failed(
            event, ErrorStage.MODEL_LOAD, f"the quality gate could not load the target: {err}"
        )
    except HeadUnusable as err:
        verdict = logic.head_failed(event, ErrorStage.QUALITY_GATE, str(err))
    except SpecError as err:
        verdict = logic.head_failed(event, ErrorStage.VALIDATION, str(err))
    if verdict.type == "head.failed":
        log.warning("head %s: %s", trained.head_id, verdict.payload.message)
    async with pool.connection() as conn, conn.transaction():
        if await claim(conn, consumer, verdict_id):
            await outbox.add(conn, verdict)
