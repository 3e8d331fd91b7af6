"""The HTTP surface under API_PREFIX: thin handlers over `runs`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated

import psycopg
from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from specbus.subjects import ID_PATTERN
from specops_schemas.api import (
    API_PREFIX,
    ApplyRequest,
    ApplyResponse,
    Me,
    RunCreateRequest,
    RunList,
    RunStatusResponse,
)
from specops_services.gateway import logic, runs, sse
from specops_services.gateway.auth import Developer, Principal, Viewer, pool_of
from specops_services.gateway.problems import first_line, problem, responses

log = logging.getLogger(__name__)

router = APIRouter(prefix=API_PREFIX, tags=["runs"])

IDEMPOTENCY_DOC = (
    "Optional (draft-ietf-httpapi-idempotency-key-header). A unique key per logical request, as a "
    'structured-field string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`; a bare token is accepted too). '
    "A retry with the same key and body returns the stored response (with `Idempotent-Replayed: true`) "
    "instead of acting twice; the same key with another body is a 422, and a retry while the first "
    "request is still being processed is a 409. Keys are scoped to the tenant and expire 24 hours after "
    "the response was stored; only successful (2xx) responses are stored, so a request that failed may "
    "be retried with the same key. Without the header the POST is accepted but not protected against "
    "duplicates."
)
LAST_EVENT_ID_DOC = "The `id` of the last event received; the stream resumes after it."

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", description=IDEMPOTENCY_DOC)]
RunId = Annotated[str, Path(description="Run id, as returned by `POST runs`.")]
PageLimit = Annotated[
    int, Query(ge=1, le=logic.PAGE_MAX, description="Most rows in the page (the newest first).")
]
Before = Annotated[
    str | None,
    Query(
        pattern=f"^{ID_PATTERN}$",
        description="The previous page's `next_before`: the page starts after that row. Omit for the newest.",
    ),
]


# The helpers below are shared by every router's POSTs (tune, heads, security routes too).


def parse_key(raw: str | None) -> str | None:
    """The Idempotency-Key header's key (None without one); 400 if it is malformed."""
    if raw is None:
        return None
    try:
        return logic.parse_idempotency_key(raw)
    except ValueError as exc:
        raise problem(400, str(exc)) from None


async def request_fingerprint(request: Request) -> str:
    """What an idempotent replay must match: method, path and body."""
    return logic.request_fingerprint(request.method, request.url.path, await request.body())


def json_reply(reply: logic.Reply) -> JSONResponse:
    """A handler's reply (status, body, headers) as the response."""
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)


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
    body: RunCreateRequest, request: Request, principal: Developer, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    key = parse_key(idempotency_key)
    limit = request.app.state.settings.gateway_max_active_runs
    fingerprint = await request_fingerprint(request)
    reply = await runs.create_run(pool_of(request), principal, body, key, fingerprint, max_active_runs=limit)
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
    request: Request, principal: Viewer, limit: PageLimit = logic.PAGE_DEFAULT, before: Before = None
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


def resume_after(
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description=LAST_EVENT_ID_DOC)] = None,
) -> int:
    """The event sequence a stream resumes after (Last-Event-ID); 400 if it is malformed."""
    try:
        return logic.parse_last_event_id(last_event_id)
    except ValueError as exc:
        raise problem(400, str(exc)) from None


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


async def follow_feed(
    request: Request, principal: Principal, feed: sse.Feed, after: int, what: str
) -> AsyncIterator[ServerSentEvent]:
    """`sse.follow` under the app's SSE settings; a database outage ends the stream (logged as `what`'s)."""
    settings = request.app.state.settings
    events = sse.follow(
        pool_of(request),
        request.app.state.listener,
        principal,
        feed,
        after,
        poll_s=settings.gateway_sse_poll_s,
        keepalive_s=settings.gateway_sse_keepalive_s,
        token_check_s=settings.gateway_sse_token_check_s,
    )
    try:
        async for event in events:
            yield event
    except psycopg.OperationalError as exc:
        # The headers are sent, so no 503 now: the stream ends, and the client's reconnection
        # (with Last-Event-ID) gets the 503 until the database is back.
        log.warning("database unavailable: the event stream of %s ends: %s", what, first_line(exc))


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
        await request_fingerprint(request),
        request.app.state.settings.artifact_root,
    )
    return json_reply(reply)
