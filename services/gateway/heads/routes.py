"""The T3 HTTP surface under API_PREFIX: the head registry (thin handlers over `heads`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from speccatalog import artifacts
from specops_schemas.api import API_PREFIX
from specops_schemas.heads import (
    HeadDataResponse,
    HeadList,
    HeadResponse,
    HeadTrainRequest,
    HeadTransitionRequest,
)
from specops_services.gateway.heads import service as heads
from specops_services.gateway.http.auth import Developer, Viewer, pool_of
from specops_services.gateway.http.problems import problem, responses
from specops_services.gateway.http.sse import follow_feed, resume_after
from specops_services.gateway.http.uploads import receive, settle
from specops_services.gateway.idempotency import IdempotencyKey, json_reply, parse_key, request_hash

router = APIRouter(prefix=API_PREFIX, tags=["heads"])

HEAD_DATA_PATH = f"{API_PREFIX}/heads/data"
HeadId = Annotated[str, PathParam(description="Head id (`hd-<hex>`), as `POST heads/train` returned.")]
JSONL_TYPES = ("application/jsonl", "application/x-ndjson")


@router.post(
    "/heads/data",
    status_code=201,
    response_model=HeadDataResponse,
    summary="Upload training or held-out data for a head",
    description=(
        'The body is a JSONL of `{"prompt", "completion"}` lines (`application/jsonl` or '
        "`application/x-ndjson`), stored by its sha256 in the tenant's part of the artifact store; "
        "`POST heads/train` names it by that sha256. 201 for new bytes, 200 when the tenant uploaded "
        "them before (content-addressed, so a retry is safe without an Idempotency-Key)."
    ),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {media: {"schema": {"type": "string"}} for media in JSONL_TYPES},
        }
    },
    responses={
        200: {"model": HeadDataResponse, "description": "The tenant uploaded these bytes already."},
        **responses(401, 403, 413, 415, 422, 500, 503),
    },
)
async def upload_data(request: Request, principal: Developer) -> JSONResponse:
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media not in JSONL_TYPES:
        raise problem(
            415,
            f"head data is sent as {', '.join(JSONL_TYPES)}; got {media or 'no Content-Type'}",
            type="urn:specops:problem:unsupported-media-type",
        )
    settings = request.app.state.settings
    root: Path = settings.artifact_root
    tenant = principal.tenant_id
    tmp, sha256, size = await receive(
        request, root / artifacts.HEAD_DATA_DIR / tenant, settings.datastore_max_bytes
    )
    try:
        examples = await asyncio.to_thread(heads.count_examples, tmp)
        await asyncio.to_thread(settle, tmp, root / artifacts.head_data_path(tenant, sha256))
    except heads.HeadDataError as exc:
        raise heads.invalid_data(str(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)
    row, created = await heads.record_data(
        pool_of(request), principal, sha256=sha256, size_bytes=size, examples=examples
    )
    return JSONResponse(row.model_dump(mode="json"), status_code=201 if created else 200)


@router.post(
    "/heads/train",
    status_code=202,
    response_model=HeadResponse,
    summary="Train a T3 head (Medusa, EAGLE, EAGLE-3) for a target on uploaded data",
    description=(
        "Registers the head as `training` and queues `head.requested` for the head-trainer; the quality "
        "gate then measures it on the held-out prompts and the head becomes `validated` or `rejected`. "
        "`train_data` / `heldout_data` are sha256s of `POST heads/data` uploads of this tenant (422 "
        "otherwise); `eagle3` needs ENABLE_L4_EAGLE3_TRAINING on the gateway (422 otherwise). Follow "
        "`Location` or the head's event stream. 429 (with `Retry-After`) while the tenant's monthly GPU "
        "budget is spent; 403 when its security policy opts out of speculation."
    ),
    responses={
        202: {
            "description": "Accepted; the head trains.",
            "headers": {"Location": {"description": "URL of the head.", "schema": {"type": "string"}}},
        },
        **responses(400, 401, 403, 409, 422, 429, 500, 503),
    },
)
async def train_head(
    body: HeadTrainRequest, request: Request, principal: Developer, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    key = parse_key(idempotency_key)
    digest = await request_hash(request)
    models_dir = request.app.state.settings.gateway_models_dir
    return json_reply(
        await heads.train(pool_of(request), principal, body, key, digest, models_dir=models_dir)
    )


@router.get(
    "/heads",
    response_model=HeadList,
    summary="The tenant's heads, newest first",
    responses=responses(401, 403, 500, 503),
)
async def list_heads(request: Request, principal: Viewer) -> HeadList:
    return await heads.list_heads(pool_of(request), principal)


@router.get(
    "/heads/{head_id}",
    response_model=HeadResponse,
    summary="A head: state, training curve, artifact, gate result, transitions",
    responses=responses(401, 403, 404, 422, 500, 503),
)
async def get_head(head_id: HeadId, request: Request, principal: Viewer) -> HeadResponse:
    return await heads.read_head(pool_of(request), principal, head_id)


@router.post(
    "/heads/{head_id}/transition",
    response_model=HeadResponse,
    summary="Move a head in its lifecycle: uat, production or deprecated",
    description=(
        "validated -> uat: developer or above; uat -> production: admin or head_reviewer, with a "
        "`rationale` (recorded in speculative_head_approvals); validated | uat | production -> "
        "deprecated: developer or above, with a `rationale` (cached answers that list it are forgotten). "
        "Each move is a `head.transitioned` event. 409 for a move the lifecycle has not, 403 for a "
        "role too low, 422 without a required rationale."
    ),
    responses=responses(400, 401, 403, 404, 409, 422, 500, 503),
)
async def transition_head(
    head_id: HeadId,
    body: HeadTransitionRequest,
    request: Request,
    principal: Developer,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    key = parse_key(idempotency_key)
    digest = await request_hash(request)
    return json_reply(await heads.transition(pool_of(request), principal, head_id, body, key, digest))


async def _owned_head(head_id: HeadId, request: Request, principal: Viewer) -> str:
    # A dependency, not the generator: the 404 must be decided before the stream starts.
    await heads.require_head(pool_of(request), principal, head_id)
    return head_id


@router.get(
    "/heads/{head_id}/events",
    response_class=EventSourceResponse,
    summary="The head's events as server-sent events",
    description=(
        "`text/event-stream`, as a run's: `id:` (its sequence in the head), `event:` (`head.requested`, "
        "`head.training_started`, `head.epoch_completed`, `head.trained`, `head.gated`, "
        "`head.transitioned`, `head.failed`) and `data:` (the envelope as JSON). The stream ends once "
        "the head is rejected, failed or deprecated; reconnect with `Last-Event-ID` to resume."
    ),
    responses=responses(400, 401, 403, 404, 422, 500, 503),
)
async def stream_events(
    request: Request,
    principal: Viewer,
    head_id: Annotated[str, Depends(_owned_head)],
    after: Annotated[int, Depends(resume_after)],
) -> AsyncIterator[ServerSentEvent]:
    async for event in follow_feed(request, principal, heads.event_feed(head_id), after, head_id):
        yield event
