"""What each tuner handler does inside its inbox transaction: lock the session (db), decide
(logic, rule), talk to the study (study.py, in a worker thread), write (db), and return the
events to queue in the outbox with it.

Every step locks the session row first (`db.lock_session`), so the handlers of one
session, on any replica and in any order, and the budget ticker, run one at a time.
Optuna's writes are outside the transaction; study.py says how the two are reconciled
(a trial asked but not committed is told FAIL before the next ask; `tell` skips a
finished trial), so a crash anywhere loses no measured trial and measures none twice.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from specbus import outbox
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import BenchCompleted, BenchRequested, GateEvaluated, RunFailed
from specops_schemas.security import OPT_OUT_REASON, PolicyChanged
from specops_schemas.tune import (
    TrialResult,
    TuneImproved,
    TuneRequested,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneTerminated,
    TuneTrialCompleted,
)
from specops_services.tuner import db, logic, rule, study
from specops_services.tuner import space as search
from specops_services.tuner.logic import Session, Trial
from specplatform.db import Pool, role_transaction, tenant_transaction

log = logging.getLogger(__name__)

Events = list[Envelope[Any]]
# The stop_reason of a session ended at once because its tenant opts out of speculation (F-S3).
OPT_OUT = "speculation_disabled"


@dataclass(frozen=True, slots=True)
class Tuner:
    """What the steps need besides the event: the study's database and the service's knobs."""

    dsn: str
    bench: logic.BenchSize
    parallel: int = 1
    tick_s: float = 5.0
    grace_s: float = 60.0
    narrow_after: int = 6
    narrow_threshold: float = 0.05


def _now() -> datetime:
    return datetime.now(UTC)


# --- tune.requested ------------------------------------------------------------------------------


async def requested(conn: db.Connection, event: Envelope[TuneRequested], tuner: Tuner) -> Events:
    """Create the session and its study (seeded with the T1 pareto points), start the clock,
    and request the first trial(s)."""
    req = event.payload
    session_id = req.session_id
    if await db.lock_session(conn, session_id) is not None:
        log.warning("session %s exists already; %s ignored", session_id, event.event_id)
        return []
    space = logic.space_of(req)
    now = _now()
    budget_s = req.request.budget_minutes * 60.0
    session = Session(
        session_id=session_id,
        tenant_id=event.tenant_id,
        requested=req,
        space=list(space.dimensions),
        seeded=0,
        budget_s=budget_s,
        started_at=now,
        deadline=now + timedelta(seconds=budget_s),
        heartbeat_at=now,
        downtime_s=0.0,
        dropped={},
        importances={},
        rule_checked=False,
        auto_terminated=False,
        curve=[],
        stop_reason=None,
        ended=False,
    )
    opted_out = await db.POLICIES.disabled(conn, event.tenant_id, hold=True)
    if req.speculation_disabled or opted_out:
        await db.insert_session(conn, session)
        return await _opt_out(conn, tuner, session, [], event, now)
    if not space.dimensions:
        await db.insert_session(conn, session)
        await db.save_session(conn, replace(session, stop_reason="failed"), ended_at=now, failed=True)
        message = "the T1 run has no candidate of the families asked for: nothing to tune"
        return [logic.emit(session, logic.failed(session, ErrorStage.VALIDATION, message), event)]
    seeds = logic.seeds(req, space)
    await asyncio.to_thread(study.create, tuner.dsn, session_id, seeds)
    session = replace(session, seeded=len(seeds))
    await db.insert_session(conn, session)
    started = TuneStarted(
        session_id=session_id,
        space=session.space,
        seeded=len(seeds),
        budget_s=budget_s,
        started_at=now,
        deadline=session.deadline,
    )
    events: Events = [logic.emit(session, started, event)]
    events += await _advance(conn, tuner, session, [], event, now)
    return events


async def policy_changed(conn: db.Connection, event: Envelope[PolicyChanged], tuner: Tuner) -> Events:
    """Fold a tenant's new security policy: whether its sessions may speculate (F-S3). Once it
    opts out, its later sessions run no trial and its open ones end now (`_opt_out`). The folded
    policy decides, not the event's: an older version, delivered late, changes nothing."""
    if not await db.POLICIES.fold(conn, event.payload.policy):
        return []
    events: Events = []
    for session_id in await db.open_sessions(conn, event.payload.policy.tenant_id):
        session = await db.lock_session(conn, session_id)
        if session is None or session.ended:
            continue
        now = _now()
        session = clocked(session, tuner, now)
        events += await _opt_out(conn, tuner, session, await db.trials(conn, session_id), event, now)
    return events


async def _opt_out(
    conn: db.Connection,
    tuner: Tuner,
    session: Session,
    trials: list[Trial],
    cause: Envelope[Any] | None,
    now: datetime,
) -> Events:
    """End a session of a tenant that opted out: its running trials fail (the study is told),
    and it completes as `speculation_disabled` with no winner. What their benches report
    later finds no running trial, so it is not taken."""
    events: Events = []
    how = logic.Ending(stage=ErrorStage.VALIDATION, message=OPT_OUT_REASON)
    for t in [t for t in trials if t.running]:
        cut = Trial(logic.ended(t.result, how, now), t.baseline)
        await db.save_trial(conn, session.session_id, cut)
        await asyncio.to_thread(study.tell, tuner.dsn, session.session_id, cut.result.trial, None)
        trials = [cut if other.result.trial == cut.result.trial else other for other in trials]
        more, session = _trial_events(session, trials, cut.result, cause, now)
        events += more
    session = replace(session, stop_reason=OPT_OUT)
    await db.save_session(conn, session, ended_at=now)
    log.info("session %s: its tenant opted out of speculation; ended", session.session_id)
    return [*events, logic.emit(session, logic.speculation_disabled(session, trials, now), cause)]


# --- a trial's bench and verdict ------------------------------------------------------------------


async def bench_completed(conn: db.Connection, event: Envelope[BenchCompleted], tuner: Tuner) -> Events:
    """Store a trial's measurement; end the trial if its verdict is in (or it failed)."""
    done = event.payload
    found = await _locked_trial(conn, tuner, done.plan.run_id, done.bench_id)
    if found is None:
        return []
    session, trials, trial = found
    m = logic.measured(trial, done)
    if isinstance(m, logic.Ending):
        return await _end_trial(conn, tuner, session, trials, trial, m, event)
    trial = Trial(logic.with_measurement(trial.result, m), done.baseline)
    return await _settle(conn, tuner, session, trials, trial, event)


async def gate_evaluated(conn: db.Connection, event: Envelope[GateEvaluated], tuner: Tuner) -> Events:
    """Store a trial's verdict (a final one is never replaced); end the trial if it is measured."""
    verdict = event.payload
    session_id = await db.session_of_bench(conn, verdict.bench_id)
    if session_id is None:
        log.debug("bench %s is no trial's (a T1 run's?); skipped", verdict.bench_id)
        return []
    found = await _locked_trial(conn, tuner, session_id, verdict.bench_id)
    if found is None:
        return []
    session, trials, trial = found
    if not verdict.replaces(trial.result.gate):
        return []
    trial = Trial(trial.result.model_copy(update={"gate": verdict.outcome()}), trial.baseline)
    return await _settle(conn, tuner, session, trials, trial, event)


async def run_failed(conn: db.Connection, event: Envelope[RunFailed], tuner: Tuner) -> Events:
    """A bench of the session could not run: fail its running trial; when the target itself
    cannot be loaded (model_load of the whole bench), no trial can run: fail the session."""
    payload = event.payload
    session = await db.lock_session(conn, payload.run_id)
    if session is None or session.ended:
        return []
    session = clocked(session, tuner, _now())
    trials = await db.trials(conn, session.session_id)
    running = [t for t in trials if t.running]
    if payload.error_stage == ErrorStage.MODEL_LOAD:
        now = _now()
        for t in running:
            failed_trial = Trial(
                logic.ended(t.result, logic.Ending(stage=payload.error_stage, message=payload.message), now),
                t.baseline,
            )
            await db.save_trial(conn, session.session_id, failed_trial)
            await asyncio.to_thread(study.tell, tuner.dsn, session.session_id, t.result.trial, None)
        await db.save_session(conn, replace(session, stop_reason="failed"), ended_at=now, failed=True)
        message = f"the target cannot be measured: {payload.message}"
        return [logic.emit(session, logic.failed(session, payload.error_stage, message), event)]
    events: Events = []
    for t in running:
        if session.ended:  # ended by the trial before (an opt-out found, `_advance`)
            break
        how = logic.Ending(stage=payload.error_stage, message=payload.message)
        events += await _end_trial(conn, tuner, session, trials, t, how, event)
        session = await db.lock_session(conn, session.session_id) or session
        trials = await db.trials(conn, session.session_id)
    return events


async def dead_letter(conn: db.Connection, tuner: Tuner, letter: DeadLetter, parked: Envelope[Any]) -> Events:
    """A service gave up on a trial's bench event: fail that trial (dead_letter) and go on."""
    payload = parked.payload
    bench_id = getattr(payload, "bench_id", None)
    if not isinstance(payload, BenchRequested | BenchCompleted | GateEvaluated) or bench_id is None:
        return []
    session_id = await db.session_of_bench(conn, bench_id)
    if session_id is None:
        return []
    found = await _locked_trial(conn, tuner, session_id, bench_id)
    if found is None:
        return []
    session, trials, trial = found
    message = (
        f"{letter.service} gave up on {parked.type} after {letter.deliveries} deliveries "
        f"and parked it on the dead-letter queue: {letter.error.strip()[:300] or 'no error text'}"
    )
    how = logic.Ending(stage=ErrorStage.DEAD_LETTER, message=message)
    return await _end_trial(conn, tuner, session, trials, trial, how, parked)


async def _locked_trial(
    conn: db.Connection, tuner: Tuner, session_id: str, bench_id: str
) -> tuple[Session, list[Trial], Trial] | None:
    """The session (locked), its trials and the running trial of `bench_id`; None if there is none."""
    session = await db.lock_session(conn, session_id)
    if session is None:
        log.debug("bench %s: %s is no session of this tuner (a T1 run?); skipped", bench_id, session_id)
        return None
    session = clocked(session, tuner, _now())
    trials = await db.trials(conn, session_id)
    trial = next((t for t in trials if t.result.bench_id == bench_id), None)
    if trial is None or not trial.running:
        log.info("bench %s of session %s is no running trial; skipped", bench_id, session_id)
        return None
    return session, trials, trial


async def _settle(
    conn: db.Connection,
    tuner: Tuner,
    session: Session,
    trials: list[Trial],
    trial: Trial,
    cause: Envelope[Any],
) -> Events:
    """Store what arrived; end the trial if its measurement and verdict are both in."""
    method = session.requested.run_request.goal.quality_gate
    how = logic.ending(trial, method, logic.priorities(session.requested))
    if how is None:
        await db.save_trial(conn, session.session_id, trial)
        return []
    return await _end_trial(conn, tuner, session, trials, trial, how, cause)


async def _end_trial(
    conn: db.Connection,
    tuner: Tuner,
    session: Session,
    trials: list[Trial],
    trial: Trial,
    how: logic.Ending,
    cause: Envelope[Any] | None,
) -> Events:
    """Record the trial's end, tell the study, then publish its point and go on."""
    now = _now()
    finished = Trial(logic.ended(trial.result, how, now), trial.baseline)
    await db.save_trial(conn, session.session_id, finished)
    await asyncio.to_thread(study.tell, tuner.dsn, session.session_id, finished.result.trial, how.value)
    trials = [finished if t.result.trial == finished.result.trial else t for t in trials]
    events, session = _trial_events(session, trials, finished.result, cause, now)
    narrowing, session = await _narrow(tuner, session, trials, cause)
    events += narrowing
    events += await _advance(conn, tuner, session, trials, cause, now)
    return events


def _trial_events(
    session: Session, trials: list[Trial], trial: TrialResult, cause: Envelope[Any] | None, now: datetime
) -> tuple[Events, Session]:
    results = [t.result for t in trials]
    before = logic.best([t for t in results if t.trial != trial.trial])
    point = logic.curve_point(trial, results, session.elapsed_s(now))
    session = replace(session, curve=[*session.curve, point])
    events: Events = [
        logic.emit(
            session, TuneTrialCompleted(session_id=session.session_id, result=trial, point=point), cause
        )
    ]
    top = logic.best(results)
    if top is not None and top.trial == trial.trial:
        previous = before.value if before is not None else None
        improved = TuneImproved(session_id=session.session_id, best=top, previous_value=previous)
        events.append(logic.emit(session, improved, cause))
    log.info(
        "session %s trial %d %s value=%s best=%s",
        session.session_id,
        trial.trial,
        trial.state,
        trial.value,
        point.best_value,
    )
    return events, session


async def _narrow(
    tuner: Tuner, session: Session, trials: list[Trial], cause: Envelope[Any] | None
) -> tuple[Events, Session]:
    """Every `narrow_after` complete trials until some are dropped (once): the importances of the
    best trial's family, and its insensitive dimensions fixed at that trial's values. Every
    computation is published (`tune.space_narrowed`, its `dropped` possibly empty), so the
    session says what was found insensitive, and what was not."""
    done = [t.result for t in trials if t.result.state == "complete"]
    if session.dropped or not done or len(done) % tuner.narrow_after:
        return [], session
    top = logic.best(done)
    if top is None:
        return [], session
    family = str(top.params["family"])
    importances = await asyncio.to_thread(
        study.importances, tuner.dsn, session.session_id, family, session.search_space()
    )
    if not importances:
        return [], session
    dropped = logic.narrowed(importances, top.params, tuner.narrow_threshold)
    session = replace(session, importances=importances, dropped=dropped)
    narrowed = TuneSpaceNarrowed(
        session_id=session.session_id, importances=importances, dropped=dropped, after_trials=len(done)
    )
    log.info("session %s: importances %s; dropped %s", session.session_id, importances, dropped or "none")
    return [logic.emit(session, narrowed, cause)], session


async def _advance(
    conn: db.Connection,
    tuner: Tuner,
    session: Session,
    trials: list[Trial],
    cause: Envelope[Any] | None,
    now: datetime,
) -> Events:
    """After a trial ended (or at the start): decide whether to stop, then start trials up to
    the parallel limit, or end the session when it stops with nothing left in flight. A
    session of a tenant found opted out starts no trial: it ends (`_opt_out`)."""
    if await db.POLICIES.disabled(conn, session.tenant_id):
        return await _opt_out(conn, tuner, session, trials, cause, now)
    events: Events = []
    space = session.search_space()
    results = [t.result for t in trials]
    if session.stop_reason is None:
        reason = logic.stop_reason(session, results, now, space.size())
        if reason is None and rule.due(session.elapsed_s(now), session.budget_s, session.rule_checked):
            verdict = rule.check(logic.rule_trials(results))
            session = replace(session, rule_checked=True)
            log.info("session %s: rule checked: %s", session.session_id, verdict.reason)
            if verdict.fired and verdict.top3_start is not None and verdict.top3_now is not None:
                reason = verdict.reason
                session = replace(session, auto_terminated=True)
                terminated = TuneTerminated(
                    session_id=session.session_id,
                    reason=verdict.reason,
                    elapsed_s=session.elapsed_s(now),
                    top3_start=verdict.top3_start,
                    top3_now=verdict.top3_now,
                    sigma=verdict.sigma,
                )
                events.append(logic.emit(session, terminated, cause))
        session = replace(session, stop_reason=reason)
    infeasible = 0
    while session.stop_reason is None and sum(t.running for t in trials) < tuner.parallel:
        trial, more = await _start_trial(conn, tuner, session, trials, space, cause, now)
        trials.append(trial)
        events += more
        if trial.result.state == "failed":
            infeasible += 1
            if infeasible >= logic.MAX_INFEASIBLE_IN_A_ROW:
                session = replace(session, stop_reason=logic.STOP_SPACE)
            elif (
                reason := logic.stop_reason(session, [t.result for t in trials], now, space.size())
            ) is not None:
                session = replace(session, stop_reason=reason)
    ended_at = None
    if session.stop_reason is not None and not any(t.running for t in trials):
        completed = logic.completed(
            session, trials, now, session.stop_reason, auto_terminated=session.auto_terminated
        )
        events.append(logic.emit(session, completed, cause))
        ended_at = now
        log.info("session %s completed: %s", session.session_id, session.stop_reason)
    await db.save_session(conn, session, ended_at=ended_at)
    return events


async def _start_trial(
    conn: db.Connection,
    tuner: Tuner,
    session: Session,
    trials: list[Trial],
    space: search.Space,
    cause: Envelope[Any] | None,
    now: datetime,
) -> tuple[Trial, Events]:
    """Ask the study for the next trial and request its bench (or fail it at once if infeasible)."""
    number, params, seeded = await asyncio.to_thread(
        study.ask,
        tuner.dsn,
        session.session_id,
        space,
        seed=session.requested.request.seed,
        dropped=session.dropped,
        known=[t.result.trial for t in trials],
    )
    candidate = search.to_candidate(params, space, number)
    result = TrialResult(
        trial=number,
        bench_id=logic.bench_id_for(session.session_id, number),
        candidate=candidate,
        params=params,
        seeded=seeded,
        state="running",
        started_at=now,
    )
    problem = search.infeasible(candidate)
    if problem is not None:
        how = logic.Ending(stage=ErrorStage.VALIDATION, message=problem)
        trial = Trial(logic.ended(result, how, now))
        await db.insert_trial(conn, session.session_id, trial)
        await asyncio.to_thread(study.tell, tuner.dsn, session.session_id, number, None)
        point = logic.curve_point(
            trial.result, [*(t.result for t in trials), trial.result], session.elapsed_s(now)
        )
        return trial, [
            logic.emit(
                session,
                TuneTrialCompleted(session_id=session.session_id, result=trial.result, point=point),
                cause,
            )
        ]
    trial = Trial(result)
    await db.insert_trial(conn, session.session_id, trial)
    plan = logic.bench_plan(session.session_id, session.requested, candidate, tuner.bench)
    log.info(
        "session %s trial %d: %s%s",
        session.session_id,
        number,
        candidate.candidate_id,
        " (seed)" if seeded else "",
    )
    return trial, [logic.emit(session, BenchRequested(bench_id=result.bench_id, plan=plan), cause)]


# --- the budget clock ------------------------------------------------------------------------------


async def tick(pool: Pool, tuner: Tuner) -> int:
    """Heartbeat every running session (a gap over 3 ticks is downtime), and end those whose
    deadline passed by more than the grace while a trial is still in flight (that trial is
    failed as `timeout`). Each session in a transaction of its own, its tenant's; the number of
    events queued."""
    async with pool.connection() as conn, role_transaction(conn, db.TICKER):
        running = await db.running_sessions(conn)
    queued = 0
    for session_id, tenant_id in running:
        async with pool.connection() as conn, tenant_transaction(conn, tenant_id):
            session = await db.lock_session(conn, session_id, skip_locked=True)
            if session is None or session.ended:
                continue
            events = await _tick_session(conn, tuner, session)
            for event in events:
                await outbox.add(conn, event)
            queued += len(events)
    return queued


def clocked(session: Session, tuner: Tuner, now: datetime) -> Session:
    """The session with its heartbeat moved to `now`, and a gap of over 3 ticks since the last
    one (no tuner was running) added to its downtime. Every step that saves a session
    clocks it first, so a session that ends before the next tick still counts its downtime."""
    gap = logic.downtime_gap(session.heartbeat_at, now, tuner.tick_s)
    if gap:
        log.warning("session %s: no tuner for %.1f s; counted as downtime", session.session_id, gap)
    return replace(session, heartbeat_at=now, downtime_s=session.downtime_s + gap)


async def _tick_session(conn: db.Connection, tuner: Tuner, session: Session) -> Events:
    now = _now()
    session = clocked(session, tuner, now)
    if now < session.deadline + timedelta(seconds=tuner.grace_s):
        await db.save_session(conn, session)
        return []
    trials = await db.trials(conn, session.session_id)
    running = [t for t in trials if t.running]
    if not running:
        # Nothing in flight past the deadline: end it (a step that would have is gone).
        return await _advance(
            conn,
            tuner,
            replace(session, stop_reason=session.stop_reason or logic.STOP_BUDGET),
            trials,
            None,
            now,
        )
    events: Events = []
    for t in running:
        if session.ended:  # ended by the trial before (an opt-out found, `_advance`)
            break
        how = logic.Ending(
            stage=ErrorStage.TIMEOUT, message="cut by the budget: still running after the deadline"
        )
        session = replace(session, stop_reason=session.stop_reason or logic.STOP_BUDGET)
        events += await _end_trial(conn, tuner, session, trials, t, how, None)
        session = await db.lock_session(conn, session.session_id) or session
        trials = await db.trials(conn, session.session_id)
    return events
