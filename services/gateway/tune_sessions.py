"""What each tune-sessions endpoint does: validation, transactions, events (runs.py's counterpart for T2).

Routes (tune_routes.py) call these; SQL lives in tune_db.py and db.py, decisions in
tune_logic.py. POSTs go through `runs.keyed` (Idempotency-Key, one tenant transaction).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from specbus import outbox
from specbus.envelope import new_event
from specops_schemas import engine_flags
from specops_schemas.api import ApplyRequest
from specops_schemas.candidates import CandidateResult
from specops_schemas.tune import TuneRequested, TuneSessionCreateRequest, TuneSessionList, TuneSessionResponse
from specops_services.gateway import (
    curve,
    db,
    heads_db,
    logic,
    results,
    security,
    sse,
    tune_db,
    tune_logic,
)
from specops_services.gateway import tune_projection as projection
from specops_services.gateway.auth import Principal
from specops_services.gateway.problems import problem
from specops_services.gateway.runs import PRODUCER, keyed, not_found
from specplatform.db import Connection, Pool, tenant_transaction

NOT_TUNABLE = "urn:specops:problem:run-not-tunable"


def response(row: tune_db.SessionRow) -> TuneSessionResponse:
    """The GET body: the folded session, as of its row, linking its curve once it has a point."""
    session = row.session
    png = tune_logic.curve_location(session.id) if session.curve else None
    return session.model_copy(update={"updated_at": row.updated_at, "curve_png": png})


# --- POST tune-sessions ---------------------------------------------------------------------


async def create_session(
    pool: Pool, principal: Principal, request: TuneSessionCreateRequest, key: str | None, fingerprint: str
) -> logic.Reply:
    """A new session on a completed, measured run of the caller's tenant; tune.requested queued.
    Refused (429) while the tenant's GPU budget is spent."""

    async def work(conn: Connection) -> logic.Reply:
        await security.require_budget(conn, pool, principal, "tune.create")
        run = await db.get_run(conn, principal.tenant_id, request.run_id)
        if run is None:
            raise problem(404, f"no run '{request.run_id}' in this tenant")
        conflict = tune_logic.create_conflict(run.run_id, run.state.status, run.state.measured)
        if conflict is not None:
            raise problem(409, conflict, type=NOT_TUNABLE)
        session_id = logic.new_run_id()
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
        return logic.Reply(202, body, {"Location": tune_logic.session_location(session_id)})

    return await keyed(pool, principal, key, fingerprint, work)


# --- GET tune-sessions/{id}[/curve.png] ----------------------------------------------------------


async def _read(pool: Pool, principal: Principal, session_id: str) -> tune_db.SessionRow:
    if not logic.is_spec_id(session_id):
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
    page, cursor = logic.next_before(rows, limit, lambda row: row.session_id)
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
    fingerprint: str,
    artifact_root: Path,
) -> logic.Reply:
    async def work(conn: Connection) -> logic.Reply:
        row = None
        if logic.is_spec_id(session_id):
            row = await tune_db.get_session(conn, principal.tenant_id, session_id)
        if row is None:
            raise not_found("tune session", session_id)
        conflict = tune_logic.apply_conflict(row.session)
        if conflict is not None:
            raise problem(409, conflict, type="urn:specops:problem:tune-session-not-applicable")
        try:
            chosen = tune_logic.pick_candidate(row.session, body.candidate_id)
        except LookupError as exc:
            raise problem(422, str(exc), type="urn:specops:problem:unknown-candidate") from None
        engine = body.engine or row.source.request.target.engine
        paths = await heads_db.artifact_paths(conn, principal.tenant_id, [chosen.draft], artifact_root)
        try:
            applied = engine_flags.apply_response(session_id, chosen, engine, draft_paths=paths)
        except engine_flags.EngineCannotRun as exc:
            raise problem(422, str(exc), type="urn:specops:problem:engine-cannot-run") from None
        return logic.Reply(200, applied.model_dump(mode="json"), {})

    return await keyed(pool, principal, key, fingerprint, work)


# --- GET tune-sessions/{id}/events ---------------------------------------------------------------


def event_feed(session_id: str) -> sse.Feed:
    """The session's events, as `sse.follow` reads them, until tune.completed / tune.failed."""

    async def read(conn: Connection, after: int) -> tuple[bool, list[db.EventRow]]:
        status = await tune_db.session_status(conn, session_id)
        rows = await tune_db.events_after(conn, session_id, after)
        return status is None or status in tune_logic.TERMINAL_STATUSES, rows

    location = tune_logic.session_location(session_id)
    return sse.Feed(session_id, location, read, tune_logic.TERMINAL_EVENT_TYPES)
