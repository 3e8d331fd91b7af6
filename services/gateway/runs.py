"""What each endpoint does: validation, transactions, events. Routes call these; SQL lives in db.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specbus import outbox
from specbus.envelope import Envelope, new_event
from speccatalog.hardware import HardwareError, resolve_profile
from speccatalog.targets import TargetError, UnknownModel, parse_hf_config, resolve_target
from specops_schemas import engine_flags
from specops_schemas.api import (
    API_PREFIX,
    ApplyRequest,
    Problem,
    ProblemFieldError,
    RunCreateRequest,
    RunList,
    RunStatusResponse,
)
from specops_schemas.events import RunCompleted, RunFailed, RunQueued, RunRequested
from specops_schemas.heads import HeadFailed, HeadRequested, HeadTransitioned
from specops_schemas.registry import DatastoreRegistered
from specops_schemas.security import PolicyChangeRequested, SecurityRefused
from specops_schemas.tune import TuneRequested
from specops_services.gateway import cache, db, heads_db, logic, projection, results, security, sse
from specops_services.gateway.auth import Principal
from specops_services.gateway.problems import ProblemError, problem
from specplatform.db import Connection, Pool, tenant_transaction

log = logging.getLogger(__name__)

PRODUCER = results.PRODUCER
# What the gateway publishes on SPEC (its NATS user may publish these subjects, and the
# tenants' result subjects, only); run.failed is the reaper's, tune.requested POST tune-sessions',
# registry.datastore_registered the datastores upload's, head.failed the heads projector's for a
# head whose event a service parked, security.policy_requested PUT security/policy's and
# security.refused a refused policy change's or a measuring POST's over the GPU budget.
PUBLISHES = (
    RunRequested,
    RunQueued,
    RunCompleted,
    RunFailed,
    TuneRequested,
    DatastoreRegistered,
    HeadRequested,
    HeadTransitioned,
    HeadFailed,
    PolicyChangeRequested,
    SecurityRefused,
)
Work = Callable[[Connection], Awaitable[logic.Reply]]
# The problem of a request whose Idempotency-Key another request holds right now.
KEY_IN_FLIGHT = "urn:specops:problem:idempotency-key-in-flight"


def run_location(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}"


# --- idempotent POSTs ----------------------------------------------------------------------


async def keyed(
    pool: Pool,
    principal: Principal,
    key: str | None,
    fingerprint: str,
    work: Work,
    *,
    ttl: timedelta = logic.IDEMPOTENCY_TTL,
) -> logic.Reply:
    """Run `work` in one tenant transaction, under the request's Idempotency-Key if it sent one.

    The key's advisory lock, the replay lookup, the work and the stored response share
    that transaction, so a response is stored exactly when the work's writes commit;
    it is replayed for `ttl`.
    """
    tenant = principal.tenant_id
    async with pool.connection() as conn, tenant_transaction(conn, tenant):
        if key is not None:
            if not await db.try_lock_key(conn, tenant, key):
                raise problem(
                    409,
                    "a request with this Idempotency-Key is still in progress; retry once it has finished",
                    type=KEY_IN_FLIGHT,
                )
            stored = await db.stored_response(conn, tenant, key)
            decision = logic.idempotency_decision(stored, fingerprint)
            if decision == "mismatch":
                raise problem(
                    422,
                    "this Idempotency-Key was already used with a different request; use a new key",
                    type="urn:specops:problem:idempotency-key-reused",
                )
            if decision == "replay" and stored is not None:
                return logic.Reply(
                    stored.status, stored.body, stored.headers | {"Idempotent-Replayed": "true"}
                )
        reply = await work(conn)
        if key is not None and logic.should_store(reply.status):
            response = logic.StoredResponse(fingerprint, reply.status, reply.body, reply.headers)
            await db.store_response(conn, tenant, key, response, ttl)
        return reply


# --- POST runs ---------------------------------------------------------------------------------


def _invalid(pointer: str, detail: str, kind: str) -> ProblemError:
    return ProblemError(
        Problem(
            type=f"urn:specops:problem:{kind}",
            title="Request body is invalid",
            status=422,
            detail=detail,
            errors=[ProblemFieldError(pointer=pointer, detail=detail)],
        )
    )


def check_target(request: RunCreateRequest) -> None:
    """422 naming the model or GPU profile the predictor could not describe."""
    nul = logic.nul_pointer(request.model_dump(mode="json"))
    if nul is not None:
        raise _invalid(nul, "text must not contain the NUL character (U+0000)", "invalid-text")
    ref = request.target.model_ref
    try:
        _describe(ref)
    except TargetError as exc:
        raise _invalid("#/target/model_ref", str(exc), "unknown-model") from None
    try:
        resolve_profile(request.target.gpu)
    except HardwareError as exc:
        raise _invalid("#/target/gpu", str(exc), "unknown-gpu") from None


def _describe(ref: str) -> None:
    try:
        resolve_target(ref)
    except UnknownModel:
        config = _local_config(ref)
        if config is None:
            raise
        parse_hf_config(config, ref)


def _local_config(ref: str) -> dict[str, Any] | None:
    """The config.json of a local model directory (absolute paths only), or None if there is none."""
    path = Path(ref)
    if not path.is_absolute():
        return None
    try:
        parsed = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


async def create_run(
    pool: Pool,
    principal: Principal,
    request: RunCreateRequest,
    key: str | None,
    fingerprint: str,
    *,
    max_active_runs: int,
    key_ttl: timedelta = logic.IDEMPOTENCY_TTL,
) -> logic.Reply:
    """A new run (or the winner cache's answer) for `principal`'s tenant; the intake's runs too.

    Refused (429) while the tenant's GPU budget is spent (a winner-cache hit, which measures
    nothing, is still answered); a tenant whose policy opts out of
    speculation is never answered from the winner cache: its `run.requested` says so, and the
    predictor answers it as `speculation_disabled`."""
    check_target(request)

    async def work(conn: Connection) -> logic.Reply:
        run_id = logic.new_run_id()
        queued = new_event(
            RunQueued(run_id=run_id, request=request),
            tenant_id=principal.tenant_id,
            correlation_id=run_id,
            producer=PRODUCER,
        )
        # An opted-out tenant (F-S3) is never answered from the cache: its request says so instead.
        opted_out = await security.speculation_disabled(conn, principal.tenant_id)
        completed = None if opted_out else await _cached_completion(conn, principal, request, run_id)
        if completed is not None:
            recorded: list[Envelope[Any]] = [queued, queued.follow(completed, producer=PRODUCER)]
            published = recorded
        else:
            await security.require_budget(conn, pool, principal, "run.create")
            await _check_quota(conn, principal.tenant_id, max_active_runs)
            requested = new_event(
                RunRequested(
                    run_id=run_id,
                    request=request,
                    requested_by=principal.token_id,
                    speculation_disabled=opted_out,
                ),
                tenant_id=principal.tenant_id,
                correlation_id=run_id,
                producer=PRODUCER,
            )
            recorded = [requested.follow(RunQueued(run_id=run_id, request=request), producer=PRODUCER)]
            published = [requested, *recorded]
        # Written from the events themselves, as a rebuild from the stream writes them.
        row = await projection.open_run(conn, recorded[0])
        for event in recorded:
            row = await projection.apply(conn, event) or row
            await results.repeat(conn, event)
        if row is None:
            raise RuntimeError(f"run {run_id} was not created")
        for event in published:
            await outbox.add(conn, event)
        body = _response(row).model_dump(mode="json")
        return logic.Reply(200 if completed else 202, body, {"Location": run_location(run_id)})

    return await keyed(pool, principal, key, fingerprint, work, ttl=key_ttl)


async def _check_quota(conn: Connection, tenant_id: str, max_active_runs: int) -> None:
    """429 when the tenant has `max_active_runs` runs queued or running already (a cache hit needs none)."""
    active = await db.active_runs(conn, tenant_id)
    if active >= max_active_runs:
        raise problem(
            429,
            f"the tenant has {active} runs queued or running, its limit; "
            "retry when one has completed or failed",
            type="urn:specops:problem:quota-exceeded",
        )


async def _cached_completion(
    conn: Connection, principal: Principal, request: RunCreateRequest, run_id: str
) -> RunCompleted | None:
    if not cache.cacheable(request):
        return None
    row = await db.cached_winner(conn, cache.key_columns(request, tenant_id=principal.tenant_id))
    if row is None:
        return None
    try:
        return RunCompleted.model_validate(
            {
                "run_id": run_id,
                "cache_hit": True,
                "measured": row["measured"],
                "winner": row["winner"],
                "candidates": row["candidates"],
                "pareto_front": row["pareto_front"],
            }
        )
    except ValidationError as exc:
        # A cache row this code cannot read is a miss, not a failed request.
        log.warning("ignoring an unreadable winner_cache row: %s", exc)
        return None


def _response(row: db.RunRow) -> RunStatusResponse:
    return logic.run_response(
        run_id=row.run_id,
        request=row.request,
        state=row.state,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


# --- GET runs/{id} --------------------------------------------------------------------------


def not_found(noun: str, spec_id: str) -> ProblemError:
    """The 404 of a run or tune session the tenant has no `spec_id` of; an off-grammar id is not echoed."""
    if not logic.is_spec_id(spec_id):
        return problem(404, f"no {noun} with that id in this tenant")
    return problem(404, f"no {noun} '{spec_id}' in this tenant")


async def read_run(pool: Pool, principal: Principal, run_id: str) -> RunStatusResponse:
    if not logic.is_spec_id(run_id):
        raise not_found("run", run_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        row = await db.get_run(conn, principal.tenant_id, run_id)
    if row is None:
        raise not_found("run", run_id)
    return _response(row)


async def list_runs(pool: Pool, principal: Principal, *, limit: int, before: str | None) -> RunList:
    """A page of the tenant's runs, newest first."""
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        rows = await db.list_runs(conn, principal.tenant_id, limit=limit + 1, before=before)
    page, cursor = logic.next_before(rows, limit, lambda row: row.run_id)
    return RunList(runs=[logic.run_summary(_response(row)) for row in page], next_before=cursor)


# --- POST runs/{id}/apply -------------------------------------------------------------------


async def apply_run(
    pool: Pool,
    principal: Principal,
    run_id: str,
    body: ApplyRequest,
    key: str | None,
    fingerprint: str,
    artifact_root: Path,
) -> logic.Reply:
    async def work(conn: Connection) -> logic.Reply:
        row = await db.get_run(conn, principal.tenant_id, run_id) if logic.is_spec_id(run_id) else None
        if row is None:
            raise not_found("run", run_id)
        conflict = logic.apply_conflict(row.state)
        if conflict is not None:
            raise problem(409, conflict, type="urn:specops:problem:run-not-applicable")
        try:
            chosen = logic.pick_candidate(row.state, body.candidate_id)
        except LookupError as exc:
            raise _invalid("#/candidate_id", str(exc), "unknown-candidate") from None
        engine = body.engine or row.request.target.engine
        paths = await heads_db.artifact_paths(
            conn, principal.tenant_id, [chosen.candidate.draft], artifact_root
        )
        try:
            response = engine_flags.apply_response(run_id, chosen.candidate, engine, draft_paths=paths)
        except engine_flags.EngineCannotRun as exc:
            raise problem(422, str(exc), type="urn:specops:problem:engine-cannot-run") from None
        return logic.Reply(200, response.model_dump(mode="json"), {})

    return await keyed(pool, principal, key, fingerprint, work)


# --- GET runs/{id}/events -----------------------------------------------------------------------


async def require_run(pool: Pool, principal: Principal, run_id: str) -> None:
    if not logic.is_spec_id(run_id):
        raise not_found("run", run_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        if await db.get_run(conn, principal.tenant_id, run_id) is None:
            raise not_found("run", run_id)


def event_feed(run_id: str) -> sse.Feed:
    """The run's events, as `sse.follow` reads them, until its terminal event."""

    async def read(conn: Connection, after: int) -> tuple[bool, list[db.EventRow]]:
        status = await db.run_status(conn, run_id)
        rows = await db.events_after(conn, run_id, after)
        return status is None or status in logic.TERMINAL_STATUSES, rows

    return sse.Feed(run_id, run_location(run_id), read, logic.TERMINAL_EVENT_TYPES)
