"""What each predictor handler does inside its inbox transaction: read (db), decide (logic),
write (db), and return the events to queue in the outbox with it.

Each step runs under `specbus.process_once`, so a redelivered event changes nothing
and a crash before commit leaves no trace; a bench's steps lock the bench row first
(`db.lock_bench`), so bench.completed, the gate verdicts and a dead letter of the run,
handled in any order and on any replica, answer the run exactly once. Every step that
publishes a run's end marks the run ended (`db.mark_ended`) in the same transaction.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from specbus import outbox
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope
from speccatalog.targets import TargetError, TargetInfo
from specops_schemas.candidates import GateOutcome
from specops_schemas.events import BenchCompleted, GateEvaluated, RunFailed, RunRequested
from specops_schemas.heads import HeadTransitioned
from specops_schemas.registry import DatastoreRegistered
from specops_schemas.security import PolicyChanged
from specops_services.predictor import db, logic, projection
from specops_services.predictor.calibration import Calibration
from specops_services.predictor.host import local_target
from specops_services.predictor.plan import HostInfo
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)

Events = list[Envelope[Any]]


@dataclass(frozen=True, slots=True)
class Planner:
    """What planning needs besides the request: the host and the service's knobs."""

    host: HostInfo
    history_rows: int = 500
    enable_cascade: bool = False
    calibrations: tuple[Calibration, ...] = ()  # this host's (calibration.load_calibrations)


async def load_target(model_ref: str) -> TargetInfo | logic.PlanFailure | None:
    """A local directory's target (read off the event loop); None for ids and aliases."""
    try:
        return await asyncio.to_thread(local_target, model_ref)
    except TargetError as exc:
        return logic.failure(exc)


async def received(pool: Pool, event: Envelope[RunRequested]) -> None:
    """Record the run as requested here and queue its `run.running(predicting)`, before planning.

    In a transaction of their own, so that a run whose planning keeps failing (until its
    request is parked) is still a run this predictor knows, and fails on that dead letter.
    The event's id is derived, so a redelivery queues nothing new.
    """
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        await db.record_run(conn, event.payload.run_id, event.tenant_id)
        await outbox.add(conn, logic.predicting(event))


async def run_failed(pool: Pool, event: Envelope[RunFailed]) -> None:
    """Mark a run ended by a `run.failed` (the benchmark-runner's, the quality gate's, the
    gateway's reaper's, ours), and its bench failed, so that a bench completed late answers
    nothing; unless it failed as `dead_letter`, which a redrive of the parked message undoes."""
    run_id = event.payload.run_id
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        bench = await db.lock_bench(conn, logic.bench_id_for(run_id))
        if bench is not None and not bench.finalized and logic.is_final(event.payload):
            await db.mark_failed(conn, bench.bench_id)
        await db.mark_ended(conn, run_id, event.tenant_id)


async def plan(
    conn: db.Connection,
    event: Envelope[RunRequested],
    planner: Planner,
    target: TargetInfo | logic.PlanFailure | None,
) -> Events:
    """Plan a run: persist the ranked candidates and either the bench or the predicted answer."""
    run_id, request = event.payload.run_id, event.payload.request
    if await db.is_planned(conn, run_id):
        log.warning("run %s is planned already; %s ignored", run_id, event.event_id)
        return []
    opted_out = await db.POLICIES.disabled(conn, event.tenant_id, hold=True)
    if event.payload.speculation_disabled or opted_out:
        await db.mark_ended(conn, run_id, event.tenant_id)
        return [logic.speculation_disabled(event)]
    if isinstance(target, logic.PlanFailure):
        _log_failure(run_id, target)
        await db.mark_ended(conn, run_id, event.tenant_id)
        return [logic.failed(event, target)]
    history = await db.recent_history(
        conn, event.tenant_id, request.workload.fingerprint, planner.history_rows
    )
    planned = logic.make_plan(
        request,
        run_id=run_id,
        host=planner.host,
        history=history,
        target=target,
        enable_cascade=planner.enable_cascade,
        datastores=await db.tenant_datastores(conn, event.tenant_id),
        heads=await db.tenant_heads(conn, event.tenant_id, include_uat=request.include_uat_heads),
        calibrations=planner.calibrations,
    )
    if isinstance(planned, logic.PlanFailure):
        _log_failure(run_id, planned)
        await db.mark_ended(conn, run_id, event.tenant_id)
        return [logic.failed(event, planned)]
    if planned.bench_plan is None:
        answer = logic.predicted_answer(planned, request)
        await db.mark_ended(conn, run_id, event.tenant_id)
        events = logic.answered_events(event, planned, answer)
    else:
        bench_id = logic.bench_id_for(run_id)
        await db.create_bench(
            conn, logic.Bench(bench_id, run_id, event.tenant_id, request, planned.bench_plan)
        )
        events = logic.measuring_events(event, planned, bench_id)
    # The candidates are written from the run.predicted queued here, as a rebuild writes them.
    for queued in events:
        await projection.project(conn, queued)
    return events


async def datastore_registered(conn: db.Connection, event: Envelope[DatastoreRegistered]) -> Events:
    """Remember a tenant's uploaded corpus, for the plans of that tenant's later runs."""
    await db.record_datastore(conn, event.tenant_id, event.payload)
    return []


async def policy_changed(conn: db.Connection, event: Envelope[PolicyChanged]) -> Events:
    """Fold a tenant's new security policy: whether its runs may speculate (F-S3). Once it opts
    out, its later runs are not planned and those planned but not answered end now (`_opt_out`).
    The folded policy decides, not the event's: an older version, delivered late, changes nothing."""
    if not await db.POLICIES.fold(conn, event.payload.policy):
        return []
    events: Events = []
    for bench_id in await db.open_benches(conn, event.payload.policy.tenant_id):
        bench = await db.lock_bench(conn, bench_id)
        if bench is not None and not bench.finalized:
            events += await _opt_out(conn, bench, event)
    return events


async def head_transitioned(conn: db.Connection, event: Envelope[HeadTransitioned]) -> Events:
    """Fold a head's lifecycle move into the heads offered to its tenant's later runs."""
    await db.record_head(conn, event.tenant_id, event.payload)
    return []


async def bench_completed(conn: db.Connection, event: Envelope[BenchCompleted]) -> Events:
    """Store what the bench measured; answer the run if every verdict is in already."""
    done = event.payload
    bench = await db.lock_bench(conn, done.bench_id)
    if bench is None:
        log.debug("bench %s was not planned here (a tune session's?); skipped", done.bench_id)
        return []
    if bench.completed:
        log.warning("bench %s is completed already; %s ignored", done.bench_id, event.event_id)
        return []
    await db.complete_bench(
        conn, done.bench_id, baseline=done.baseline, results=done.results, failures=done.failures
    )
    completed = logic.Bench(
        bench.bench_id,
        bench.run_id,
        bench.tenant_id,
        bench.request,
        bench.plan,
        baseline=done.baseline,
        results=list(done.results),
        failures=list(done.failures),
        finalized=bench.finalized,
    )
    return await _answer_if_ready(conn, completed, await db.verdicts(conn, bench.bench_id), event)


async def gate_evaluated(conn: db.Connection, event: Envelope[GateEvaluated]) -> Events:
    """Store one verdict; answer the run if it was the last one missing."""
    verdict = event.payload
    bench = await db.lock_bench(conn, verdict.bench_id)
    if bench is None:
        log.debug("bench %s was not planned here (a tune session's?); skipped", verdict.bench_id)
        return []
    if bench.finalized:
        return []
    gates = await db.verdicts(conn, bench.bench_id)
    if verdict.replaces(gates.get(verdict.candidate_id)):
        gates = {**gates, verdict.candidate_id: verdict.outcome()}
        await db.save_verdicts(conn, bench.bench_id, gates)
    return await _answer_if_ready(conn, bench, gates, event)


async def dead_letter(conn: db.Connection, letter: DeadLetter, parked: Envelope[Any]) -> Events:
    """Fail the run a parked event leaves unfinished, unless it ended (or is answered) already."""
    run_id = logic.parked_run(parked)
    if run_id is None:
        log.info("dead letter of %s %s belongs to no run; skipped", parked.type, parked.event_id)
        return []
    if isinstance(parked.payload, RunRequested):
        # The request itself proves the run, even if its receipt (`received`) never committed.
        await db.record_run(conn, run_id, parked.tenant_id)
    # Locked first, as the answering steps do: whichever commits second sees the other.
    await db.lock_bench(conn, logic.bench_id_for(run_id))
    run = await db.lock_run(conn, run_id, parked.tenant_id)
    if not logic.can_fail(run):
        state = "unknown here" if run is None else "ended"
        log.info("dead letter of %s: run %s is %s; nothing to fail", parked.type, run_id, state)
        return []
    # The bench stays open: should the parked message be redriven (`specops dlq redrive`),
    # its bench.completed and verdicts still answer the run, which then completes.
    await db.mark_ended(conn, run_id, parked.tenant_id)
    return [logic.dead_letter_failed(letter, parked)]


async def _answer_if_ready(
    conn: db.Connection, bench: logic.Bench, gates: dict[str, GateOutcome], trigger: Envelope[Any]
) -> Events:
    if not bench.finalized and await db.POLICIES.disabled(conn, bench.tenant_id):
        return await _opt_out(conn, bench, trigger)
    if not logic.is_ready(bench, gates):
        return []
    await db.mark_finalized(conn, bench.bench_id)
    await db.mark_ended(conn, bench.run_id, bench.tenant_id)
    ranked = await db.ranked_candidates(conn, bench.run_id)
    try:
        answer = logic.measured_answer(bench, ranked, gates)
        learned = logic.history_rows(bench.plan, answer.candidates)
    except Exception as exc:
        # Pure decisions on stored data: a retry would fail the same way, so fail the run now.
        problem = logic.failure(exc)
        _log_failure(bench.run_id, problem)
        failed = RunFailed(run_id=bench.run_id, error_stage=problem.stage, message=problem.message)
        return [logic.answer_event(bench, trigger, failed)]
    await db.append_history(
        conn, learned, tenant_id=bench.tenant_id, run_id=bench.run_id, bench_id=bench.bench_id
    )
    return [logic.answer_event(bench, trigger, answer)]


async def _opt_out(conn: db.Connection, bench: logic.Bench, trigger: Envelope[Any]) -> Events:
    """End an open bench of a tenant that opted out: its run completes as `speculation_disabled`,
    nothing it measured is answered or kept. A run ended already (failed by a dead letter, its
    bench left open for a redrive) stays failed: the bench is closed, so a redrive answers nothing."""
    run = await db.lock_run(conn, bench.run_id, bench.tenant_id)
    await db.mark_failed(conn, bench.bench_id)
    if run is not None and run.ended:
        return []
    await db.mark_ended(conn, bench.run_id, bench.tenant_id)
    log.info("run %s: its tenant opted out of speculation; ended as speculation_disabled", bench.run_id)
    return [logic.answer_event(bench, trigger, logic.opted_out(bench.run_id))]


def _log_failure(run_id: str, problem: logic.PlanFailure) -> None:
    if problem.internal:
        log.error("run %s failed: %s", run_id, problem.message, exc_info=problem.error)
    else:
        log.info("run %s failed (%s): %s", run_id, problem.stage.value, problem.message)
