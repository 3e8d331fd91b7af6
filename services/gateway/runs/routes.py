"""The runs' HTTP surface under API_PREFIX (and `GET me`): thin handlers over the runs service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from specops_schemas.api import (
    API_PREFIX,
    ApplyRequest,
    ApplyResponse,
    Me,
    RunCreateBody,
    RunList,
    RunStatusResponse,
)
from specops_services.gateway.http import params
from specops_services.gateway.http.auth import Developer, Viewer, pool_of
from specops_services.gateway.http.params import Before, PageLimit
from specops_services.gateway.http.problems import responses
from specops_services.gateway.http.sse import follow_feed, resume_after
from specops_services.gateway.idempotency import IdempotencyKey, json_reply, parse_key, request_hash
from specops_services.gateway.runs import service as runs

router = APIRouter(prefix=API_PREFIX, tags=["runs"])


RunId = Annotated[str, Path(description="Run id, as returned by `POST runs`.")]


# The helpers below are shared by every router's POSTs (tune, heads, security routes too).


@router.post(
    "/runs",
    status_code=202,
    response_model=RunStatusResponse,
    summary="Start a T1 run",
    responses={
        200: {"model": RunStatusResponse, "description": "Winner-cache hit: the run is already completed."},
        202: {
            "description": "Accepted; follow `Location` or the run's event stream.",
            "headers": {"Location": {"description": "URL of the run.", "schema": {"type": "string"}}},
        },
        **responses(400, 401, 403, 409, 422, 429, 500, 503),
    },
)
async def create_run(
    body: RunCreateBody, request: Request, principal: Developer, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    key = parse_key(idempotency_key)
    settings = request.app.state.settings
    digest = await request_hash(request)
    reply = await runs.create_run(
        pool_of(request),
        principal,
        body,
        key,
        digest,
        max_active_runs=settings.gateway_max_active_runs,
        models_dir=settings.gateway_models_dir,
        live_fingerprint=settings.enable_auto_workload_fingerprint,
    )
    return json_reply(reply)


@router.get(
    "/me",
    response_model=Me,
    tags=["auth"],
    summary="Who the caller is: token id, tenant and role",
    responses=responses(401, 403, 500, 503),
)
async def get_me(principal: Viewer) -> Me:
    return Me(token_id=principal.token_id, tenant_id=principal.tenant_id, role=principal.role)


@router.get(
    "/runs",
    response_model=RunList,
    summary="The tenant's runs, newest first",
    description="One page of runs without their candidates (`GET runs/{id}` has those); "
    "follow `next_before` for older ones.",
    responses=responses(401, 403, 422, 500, 503),
)
async def list_runs(
    request: Request, principal: Viewer, limit: PageLimit = params.PAGE_DEFAULT, before: Before = None
) -> RunList:
    return await runs.list_runs(pool_of(request), principal, limit=limit, before=before)


@router.get(
    "/runs/{run_id}",
    response_model=RunStatusResponse,
    summary="A run's status, winner and candidates",
    responses=responses(401, 403, 404, 422, 500, 503),
)
async def get_run(run_id: RunId, request: Request, principal: Viewer) -> RunStatusResponse:
    return await runs.read_run(pool_of(request), principal, run_id)


async def _owned_run(run_id: RunId, request: Request, principal: Viewer) -> str:
    # A dependency, not the generator: the 404 must be decided before the stream starts.
    await runs.require_run(pool_of(request), principal, run_id)
    return run_id


@router.get(
    "/runs/{run_id}/events",
    response_class=EventSourceResponse,
    summary="The run's progress as server-sent events",
    description=(
        "`text/event-stream`: each event has `id:` (its sequence in the run), `event:` (its type, "
        "e.g. `run.queued`, `run.running`, `run.predicted`, `bench.rep_measured`, `run.completed`) and "
        "`data:` (the event envelope as JSON). The stream ends after `run.completed` or `run.failed`; "
        "idle streams get `: keepalive` comments. Reconnect with `Last-Event-ID` to resume. A stream "
        "whose token is revoked while it is open ends with an `error` event whose data is the 401 "
        "problem; one cut by a database outage just ends, and reconnecting gets a 503 with "
        "`Retry-After` until the database is back."
    ),
    responses=responses(400, 401, 403, 404, 422, 500, 503),
)
async def stream_events(
    request: Request,
    principal: Viewer,
    run_id: Annotated[str, Depends(_owned_run)],
    after: Annotated[int, Depends(resume_after)],
) -> AsyncIterator[ServerSentEvent]:
    async for event in follow_feed(request, principal, runs.event_feed(run_id), after, f"run {run_id}"):
        yield event


@router.post(
    "/runs/{run_id}/apply",
    response_model=ApplyResponse,
    summary="Turn the run's winner into engine flags",
    description=(
        "409 while the tenant's security policy opts out of speculation (F-S3): nothing "
        "speculative is applied for it; the refusal is audited (`security.refused`)."
    ),
    responses=responses(400, 401, 403, 404, 409, 422, 500, 503),
)
async def apply_run(
    run_id: RunId,
    request: Request,
    principal: Developer,
    body: Annotated[ApplyRequest | None, Body()] = None,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    key = parse_key(idempotency_key)
    reply = await runs.apply_run(
        pool_of(request),
        principal,
        run_id,
        body or ApplyRequest(),
        key,
        await request_hash(request),
        request.app.state.settings.artifact_root,
    )
    return json_reply(reply)
