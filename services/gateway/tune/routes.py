"""The T2 HTTP surface under API_PREFIX: thin handlers over the tune service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from specops_schemas.api import API_PREFIX, ApplyRequest, ApplyResponse
from specops_schemas.tune import TuneSessionCreateRequest, TuneSessionList, TuneSessionResponse
from specops_services.gateway.http import params
from specops_services.gateway.http.auth import Developer, Viewer, pool_of
from specops_services.gateway.http.params import Before, PageLimit
from specops_services.gateway.http.problems import responses
from specops_services.gateway.http.sse import follow_feed, resume_after
from specops_services.gateway.idempotency import IdempotencyKey, json_reply, parse_key, request_hash
from specops_services.gateway.tune import service as tune_sessions

router = APIRouter(prefix=API_PREFIX, tags=["tune-sessions"])

SessionId = Annotated[str, Path(description="Tune session id, as returned by `POST tune-sessions`.")]


@router.post(
    "/tune-sessions",
    status_code=202,
    response_model=TuneSessionResponse,
    summary="Start a T2 tune session on a completed T1 run",
    description=(
        "A budgeted Bayesian search (Optuna TPE, seeded with the run's pareto points) over family, "
        "draft, k, tree shape and each family's knobs, each trial measured (N reps, mean and sigma) "
        "and gated. The run must be the tenant's, completed, and measured on this host (404, 409 "
        "otherwise). Follow `Location` or the session's event stream. 429 (with `Retry-After`) while "
        "the tenant's monthly GPU budget is spent."
    ),
    responses={
        202: {
            "description": "Accepted; the session is queued for the tuner.",
            "headers": {"Location": {"description": "URL of the session.", "schema": {"type": "string"}}},
        },
        **responses(400, 401, 403, 404, 409, 422, 429, 500, 503),
    },
)
async def create_session(
    body: TuneSessionCreateRequest,
    request: Request,
    principal: Developer,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    key = parse_key(idempotency_key)
    digest = await request_hash(request)
    reply = await tune_sessions.create_session(pool_of(request), principal, body, key, digest)
    return json_reply(reply)


@router.get(
    "/tune-sessions",
    response_model=TuneSessionList,
    summary="The tenant's tune sessions, newest first",
    description="One page of sessions without their trials (`GET tune-sessions/{id}` has those); "
    "follow `next_before` for older ones.",
    responses=responses(401, 403, 422, 500, 503),
)
async def list_sessions(
    request: Request, principal: Viewer, limit: PageLimit = params.PAGE_DEFAULT, before: Before = None
) -> TuneSessionList:
    return await tune_sessions.list_sessions(pool_of(request), principal, limit=limit, before=before)


@router.get(
    "/tune-sessions/{session_id}",
    response_model=TuneSessionResponse,
    summary="A tune session: status, trials (mean ± sigma), best so far, curve, winner",
    responses=responses(401, 403, 404, 422, 500, 503),
)
async def get_session(session_id: SessionId, request: Request, principal: Viewer) -> TuneSessionResponse:
    return await tune_sessions.read_session(pool_of(request), principal, session_id)


async def _owned_session(session_id: SessionId, request: Request, principal: Viewer) -> str:
    # A dependency, not the generator: the 404 must be decided before the stream starts.
    await tune_sessions.require_session(pool_of(request), principal, session_id)
    return session_id


@router.get(
    "/tune-sessions/{session_id}/events",
    response_class=EventSourceResponse,
    summary="The session's progress as server-sent events",
    description=(
        "`text/event-stream`, as a run's: each event has `id:` (its sequence in the session), `event:` "
        "(`tune.requested`, `tune.started`, `tune.trial_completed`, `tune.improved`, "
        "`tune.space_narrowed`, `tune.terminated`, `tune.completed`, `tune.failed`) and `data:` (the "
        "event envelope as JSON). The stream ends after `tune.completed` or `tune.failed`; idle streams "
        "get `: keepalive` comments; reconnect with `Last-Event-ID` to resume. The curve the trials draw "
        "is `curve_png` of the session."
    ),
    responses=responses(400, 401, 403, 404, 422, 500, 503),
)
async def stream_events(
    request: Request,
    principal: Viewer,
    session_id: Annotated[str, Depends(_owned_session)],
    after: Annotated[int, Depends(resume_after)],
) -> AsyncIterator[ServerSentEvent]:
    async for event in follow_feed(
        request, principal, tune_sessions.event_feed(session_id), after, session_id
    ):
        yield event


@router.get(
    "/tune-sessions/{session_id}/curve.png",
    response_class=Response,
    summary="The best-so-far curve as a PNG",
    description="Each trial's value (failed trials marked), the best so far, the T1 winner, the budget. "
    "404 until a trial has ended.",
    responses={200: {"content": {"image/png": {}}}, **responses(401, 403, 404, 422, 500, 503)},
)
async def get_curve(session_id: SessionId, request: Request, principal: Viewer) -> Response:
    png = await tune_sessions.curve_png(pool_of(request), principal, session_id)
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-cache"})


@router.post(
    "/tune-sessions/{session_id}/apply",
    response_model=ApplyResponse,
    summary="Turn the session's winner into engine flags",
    description=(
        "409 while the tenant's security policy opts out of speculation (F-S3): nothing "
        "speculative is applied for it; the refusal is audited (`security.refused`)."
    ),
    responses=responses(400, 401, 403, 404, 409, 422, 500, 503),
)
async def apply_session(
    session_id: SessionId,
    request: Request,
    principal: Developer,
    body: Annotated[ApplyRequest | None, Body()] = None,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    key = parse_key(idempotency_key)
    reply = await tune_sessions.apply_session(
        pool_of(request),
        principal,
        session_id,
        body or ApplyRequest(),
        key,
        await request_hash(request),
        request.app.state.settings.artifact_root,
    )
    return json_reply(reply)
