"""What each tune-sessions endpoint does: validation, transactions, events (the runs service's
counterpart for T2).

The routes call these; SQL lives in this resource's db.py (and the shared db.py), decisions in
its logic.py. POSTs go through `idempotency.keyed` (Idempotency-Key, one tenant transaction).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from specbus import outbox
from specbus.envelope import new_event
from specops_schemas.api import ApplyRequest
from specops_schemas.candidates import CandidateResult
from specops_schemas.tune import TuneRequested, TuneSessionCreateRequest, TuneSessionList, TuneSessionResponse
from specops_services.gateway import apply, db, idempotency, results, runs, security
from specops_services.gateway.http import params, sse
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import not_found, problem
from specops_services.gateway.idempotency import keyed
from specops_services.gateway.results import PRODUCER
from specops_services.gateway.tune import curve, projection
from specops_services.gateway.tune import db as tune_db
from specops_services.gateway.tune import logic as tune_logic
from specplatform.db import Connection, Pool, tenant_transaction

NOT_TUNABLE = "urn:specops:problem:run-not-tunable"


def response(row: tune_db.SessionRow) -> TuneSessionResponse:
    """The GET body: the folded session, as of its row, linking its curve once it has a point."""
    session = row.session
    png = tune_logic.curve_location(session.id) if session.curve else None
    return session.model_copy(update={"updated_at": row.updated_at, "curve_png": png})


# --- POST tune-sessions ---------------------------------------------------------------------


async def create_session(
    pool: Pool, principal: Principal, request: TuneSessionCreateRequest, key: str | None, request_hash: str
) -> idempotency.Reply:
    """A new session on a completed, measured run of the caller's tenant; tune.requested queued.
    Refused (429) while the tenant's GPU budget is spent, unless its policy opts out of
    speculation: such a session runs no trial (the tuner ends it as `speculation_disabled`)."""

    async def work(conn: Connection) -> idempotency.Reply:
        run = await runs.get_run(conn, principal.tenant_id, request.run_id)
        if run is None:
            raise problem(404, f"no run '{request.run_id}' in this tenant")
        conflict = tune_logic.create_conflict(run.run_id, run.state.status, run.state.measured)
        if conflict is not None:
            raise problem(409, conflict, type=NOT_TUNABLE)
        await security.require_budget(conn, principal, "tune.create")
        session_id = params.new_spec_id()
        state = run.state
        requested = new_event(
            TuneRequested(
                session_id=session_id,
                request=request,
                run_request=run.request,
                run_candidates=[CandidateResult.model_validate(c) for c in state.candidates],
                run_pareto_front=list(state.pareto_front),
                run_winner=CandidateResult.model_validate(state.winner) if state.winner else None,
                requested_by=principal.token_id,
                speculation_disabled=await security.speculation_disabled(conn, principal.tenant_id),
            ),
            tenant_id=principal.tenant_id,
            correlation_id=session_id,
            producer=PRODUCER,
        )
        # Written from the event itself, as a rebuild from the stream writes it.
        await projection.open_session(conn, requested)
        row = await projection.apply(conn, requested)
        if row is None:
            raise RuntimeError(f"tune session {session_id} was not created")
        await results.repeat(conn, requested)
        await outbox.add(conn, requested)
        body = response(row).model_dump(mode="json")
        return idempotency.Reply(202, body, {"Location": tune_logic.session_location(session_id)})

    return await keyed(pool, principal, key, request_hash, work)


# --- GET tune-sessions/{id}[/curve.png] ----------------------------------------------------------


async def _read(pool: Pool, principal: Principal, session_id: str) -> tune_db.SessionRow:
    if not params.is_spec_id(session_id):
        raise not_found("tune session", session_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        row = await tune_db.get_session(conn, principal.tenant_id, session_id)
    if row is None:
        raise not_found("tune session", session_id)
    return row


async def read_session(pool: Pool, principal: Principal, session_id: str) -> TuneSessionResponse:
    return response(await _read(pool, principal, session_id))


async def list_sessions(
    pool: Pool, principal: Principal, *, limit: int, before: str | None
) -> TuneSessionList:
    """A page of the tenant's tune sessions, newest first."""
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        rows = await tune_db.list_sessions(conn, principal.tenant_id, limit=limit + 1, before=before)
    page, cursor = params.next_before(rows, limit, lambda row: row.session_id)
    return TuneSessionList(
        sessions=[tune_logic.session_summary(row.session, row.run_id) for row in page], next_before=cursor
    )


async def require_session(pool: Pool, principal: Principal, session_id: str) -> None:
    await _read(pool, principal, session_id)


async def curve_png(pool: Pool, principal: Principal, session_id: str) -> bytes:
    """The best-so-far curve as a PNG; 404 until a trial has ended."""
    row = await _read(pool, principal, session_id)
    session = row.session
    if not session.curve:
        raise problem(404, f"tune session '{session_id}' has no trial ended yet, so no curve")
    t1 = tune_logic.t1_winner_trial(session, row.source.winner)
    markers = curve.Markers(
        budget_s=session.budget_s,
        seeded=frozenset(t.trial for t in session.trials if t.seeded),
        t1_value=t1.value if t1 is not None else None,
        title=f"tune session {session_id[:8]} ({session.status}): best so far",
    )
    # Drawing takes tens of milliseconds of CPU: off the event loop.
    return await asyncio.to_thread(curve.draw, session.curve, markers)


# --- POST tune-sessions/{id}/apply --------------------------------------------------------------


async def apply_session(
    pool: Pool,
    principal: Principal,
    session_id: str,
    body: ApplyRequest,
    key: str | None,
    request_hash: str,
    artifact_root: Path,
) -> idempotency.Reply:
    async def work(conn: Connection) -> idempotency.Reply:
        row = None
        if params.is_spec_id(session_id):
            row = await tune_db.get_session(conn, principal.tenant_id, session_id)
        if row is None:
            raise not_found("tune session", session_id)
        session = row.session
        target = apply.Applicable(
            spec_id=session_id,
            action="tune.apply",
            conflict=tune_logic.apply_conflict(session),
            not_applicable="urn:specops:problem:tune-session-not-applicable",
            pick=lambda candidate_id: tune_logic.pick_candidate(session, candidate_id),
            measured_on=row.source.request.target.engine,
        )
        return await apply.apply_winner(conn, principal, target, body, artifact_root)

    return await keyed(pool, principal, key, request_hash, work)


# --- GET tune-sessions/{id}/events ---------------------------------------------------------------


def event_feed(session_id: str) -> sse.Feed:
    """The session's events, as `sse.follow` reads them, until tune.completed / tune.failed."""

    async def read(conn: Connection, after: int) -> tuple[bool, list[db.EventRow]]:
        status = await tune_db.session_status(conn, session_id)
        rows = await tune_db.EVENTS.after(conn, session_id, after)
        return status is None or status in tune_logic.TERMINAL_STATUSES, rows

    location = tune_logic.session_location(session_id)
    return sse.Feed(session_id, location, read, tune_logic.TERMINAL_EVENT_TYPES)
