"""What each runs endpoint does: validation, transactions, events. The routes call these; SQL lives
in this resource's db.py and the shared db.py (the winner cache)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specbus import outbox
from specbus.envelope import Envelope, new_event
from speccatalog.hardware import HardwareError, resolve_profile
from speccatalog.targets import TargetError, parse_hf_config, resolve_target
from specops_schemas.api import (
    API_PREFIX,
    ApplyRequest,
    Problem,
    ProblemFieldError,
    RunCreateBody,
    RunCreateRequest,
    RunList,
    RunStatusResponse,
)
from specops_schemas.events import RunCompleted, RunQueued, RunRequested
from specops_services.gateway import apply, db, idempotency, live_workload, results, security
from specops_services.gateway import winner_cache as cache
from specops_services.gateway.http import model_refs, params, sse
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import ProblemError, not_found, problem
from specops_services.gateway.idempotency import keyed
from specops_services.gateway.results import PRODUCER
from specops_services.gateway.runs import db as run_db
from specops_services.gateway.runs import logic as run_logic
from specops_services.gateway.runs import projection
from specplatform.db import Connection, Pool, tenant_transaction

log = logging.getLogger(__name__)


def run_location(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}"


# --- idempotent POSTs ----------------------------------------------------------------------


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


def check_target(request: RunCreateRequest, models_dir: Path | None = None) -> None:
    """422 naming the model or GPU profile the predictor could not describe; a local model_ref is
    taken only inside `models_dir` (None: no local paths)."""
    nul = params.nul_pointer(request.model_dump(mode="json"))
    if nul is not None:
        raise _invalid(nul, "text must not contain the NUL character (U+0000)", "invalid-text")
    ref = request.target.model_ref
    try:
        _describe(ref, models_dir)
    except TargetError as exc:
        raise _invalid("#/target/model_ref", str(exc), "unknown-model") from None
    try:
        resolve_profile(request.target.gpu)
    except HardwareError as exc:
        raise _invalid("#/target/gpu", str(exc), "unknown-gpu") from None


def _describe(ref: str, models_dir: Path | None) -> None:
    if not model_refs.looks_local(ref):
        resolve_target(ref)
        return
    directory = model_refs.inside(ref, models_dir)
    config = None if directory is None else _local_config(directory)
    if config is None:
        raise model_refs.refused("#/target/model_ref")
    parse_hf_config(config, ref)


def _local_config(directory: Path) -> dict[str, Any] | None:
    """The config.json of a model directory, or None if there is none."""
    try:
        parsed = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


async def create_run(
    pool: Pool,
    principal: Principal,
    body: RunCreateBody,
    key: str | None,
    request_hash: str,
    *,
    max_active_runs: int,
    models_dir: Path | None = None,
    key_ttl: timedelta = idempotency.IDEMPOTENCY_TTL,
    live_fingerprint: bool = False,
) -> idempotency.Reply:
    """A new run (or the winner cache's answer) for `principal`'s tenant; the intake's runs too.

    Refused (429) while the tenant's GPU budget is spent (a winner-cache hit, which measures
    nothing, is still answered); a tenant whose policy opts out of speculation is never
    answered from the winner cache, nor refused for its budget (nothing is measured): its
    `run.requested` says so, and the predictor answers it as `speculation_disabled`.
    A body whose fingerprint is `auto` is inferred from its samples first (off the event loop:
    up to MAX_SAMPLES texts to read), or without samples and with `live_fingerprint` from the
    tenant's live summary of the target (a 422 when there is none), and the run records how."""
    request = await _accept(pool, principal, body, live_fingerprint)
    check_target(request, models_dir)

    async def work(conn: Connection) -> idempotency.Reply:
        run_id = params.new_spec_id()
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
            await security.require_budget(conn, principal, "run.create")
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
        return idempotency.Reply(200 if completed else 202, body, {"Location": run_location(run_id)})

    return await keyed(pool, principal, key, request_hash, work, ttl=key_ttl)


async def _accept(pool: Pool, principal: Principal, body: RunCreateBody, live: bool) -> RunCreateRequest:
    """The request the body makes: its workload stated, inferred from its samples or (`auto`
    alone, with ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT) from the tenant's live traffic."""
    stated = body.workload
    if stated.fingerprint != "auto" or stated.samples:
        return await asyncio.to_thread(run_logic.accept, body)
    if not live:
        raise _invalid(
            "#/workload/samples",
            'fingerprint "auto" needs samples: send 1-64 sample prompts or chat messages as '
            "workload.samples (inferring it from live traffic is off on this gateway: "
            "ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT)",
            "auto-fingerprint-needs-samples",
        )
    model_ref = body.target.model_ref
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        summary = await live_workload.latest(conn, principal.tenant_id, model_ref)
    if summary is None:
        raise _invalid(
            "#/workload/samples",
            f'fingerprint "auto" without samples takes this tenant\'s live traffic on {model_ref}, and '
            "no engine server has summarized any yet: send workload.samples, or serve the target with "
            "`specops serve engine --nats-url ...` under ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT=1, its "
            "requests naming this tenant (X-Specops-Tenant)",
            "auto-fingerprint-no-live-traffic",
        )
    return run_logic.accept_live(body, summary)


async def _check_quota(conn: Connection, tenant_id: str, max_active_runs: int) -> None:
    """429 when the tenant has `max_active_runs` runs queued or running already (a cache hit needs none)."""
    active = await run_db.active_runs(conn, tenant_id)
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


def _response(row: run_db.RunRow) -> RunStatusResponse:
    return run_logic.run_response(
        run_id=row.run_id,
        request=row.request,
        state=row.state,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


# --- GET runs/{id} --------------------------------------------------------------------------


async def read_run(pool: Pool, principal: Principal, run_id: str) -> RunStatusResponse:
    if not params.is_spec_id(run_id):
        raise not_found("run", run_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        row = await run_db.get_run(conn, principal.tenant_id, run_id)
    if row is None:
        raise not_found("run", run_id)
    return _response(row)


async def list_runs(pool: Pool, principal: Principal, *, limit: int, before: str | None) -> RunList:
    """A page of the tenant's runs, newest first."""
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        rows = await run_db.list_runs(conn, principal.tenant_id, limit=limit + 1, before=before)
    page, cursor = params.next_before(rows, limit, lambda row: row.run_id)
    return RunList(runs=[run_logic.run_summary(_response(row)) for row in page], next_before=cursor)


# --- POST runs/{id}/apply -------------------------------------------------------------------


async def apply_run(
    pool: Pool,
    principal: Principal,
    run_id: str,
    body: ApplyRequest,
    key: str | None,
    request_hash: str,
    artifact_root: Path,
) -> idempotency.Reply:
    async def work(conn: Connection) -> idempotency.Reply:
        row = await run_db.get_run(conn, principal.tenant_id, run_id) if params.is_spec_id(run_id) else None
        if row is None:
            raise not_found("run", run_id)
        target = apply.Applicable(
            spec_id=run_id,
            action="run.apply",
            conflict=run_logic.apply_conflict(row.state),
            not_applicable="urn:specops:problem:run-not-applicable",
            pick=lambda candidate_id: run_logic.pick_candidate(row.state, candidate_id).candidate,
            measured_on=row.request.target.engine,
        )
        return await apply.apply_winner(conn, principal, target, body, artifact_root)

    return await keyed(pool, principal, key, request_hash, work)


# --- GET runs/{id}/events -----------------------------------------------------------------------


async def require_run(pool: Pool, principal: Principal, run_id: str) -> None:
    if not params.is_spec_id(run_id):
        raise not_found("run", run_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        if await run_db.get_run(conn, principal.tenant_id, run_id) is None:
            raise not_found("run", run_id)


def event_feed(run_id: str) -> sse.Feed:
    """The run's events, as `sse.follow` reads them, until its terminal event."""

    async def read(conn: Connection, after: int) -> tuple[bool, list[db.EventRow]]:
        status = await run_db.run_status(conn, run_id)
        rows = await run_db.EVENTS.after(conn, run_id, after)
        return status is None or status in run_logic.TERMINAL_STATUSES, rows

    return sse.Feed(run_id, run_location(run_id), read, run_logic.TERMINAL_EVENT_TYPES)
