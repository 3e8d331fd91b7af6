"""The engine server's HTTP app: OpenAI's `/v1/models`, `/v1/completions` and
`/v1/chat/completions`, `/health` and Prometheus `/metrics`.

Errors are OpenAI's JSON (`{"error": {"message", "type", "param", "code"}}`), which the
`openai` client raises as BadRequestError (400), NotFoundError (404), ...; a body that fails
validation is a 400, as OpenAI answers it, not FastAPI's 422.

Shutdown (SIGTERM, SIGINT): uvicorn stops accepting connections and lets the requests under
way finish for up to ``GRACE_S``, then cancels them (which cancels their rows); the lifespan
then stops the worker, which fails whatever is left, and joins its thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from speccore.engine import Engine
from specops_services.engine import responses
from specops_services.engine.drift import TENANT_HEADER, WORKLOAD_HEADER, DriftKey, key_of
from specops_services.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    error_response,
)
from specops_services.engine.serving import EngineFailure, EngineServer, InvalidRequest, ServerOptions

log = logging.getLogger(__name__)

GRACE_S = 30.0  # how long requests under way may finish after SIGTERM
JOIN_S = 60.0  # how long shutdown waits for the worker's step under way
CLIENT_CLOSED = 499  # nginx's status of a request whose client went away

T = TypeVar("T", bound=BaseModel)


def create_app(server: EngineServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if server.drift is not None:
            await server.drift.start()
        if server.policy_feed is not None:
            await server.policy_feed.start()
        server.worker.start()
        log.info("serving %s (%s) as %r", server.target.ref, server.method, server.model_name)
        try:
            yield
        finally:
            await asyncio.to_thread(server.worker.stop, JOIN_S)
            if server.drift is not None:
                await server.drift.stop()
            if server.policy_feed is not None:
                await server.policy_feed.stop()

    app = FastAPI(title="specops engine", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse(error_response(exc.status, str(exc), param=exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _unvalidated(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = [str(part) for part in first["loc"] if part != "body"]
        message = f"{'.'.join(where)}: {first['msg']}" if where else str(first["msg"])
        return JSONResponse(error_response(400, message, param=where[-1] if where else None), status_code=400)

    @app.exception_handler(EngineFailure)
    async def _failed(request: Request, exc: EngineFailure) -> JSONResponse:
        return JSONResponse(error_response(503, str(exc)), status_code=503)

    @app.get("/health")
    async def health() -> Response:
        if not server.worker.alive:
            return JSONResponse(error_response(503, "the engine worker is not running"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(
            id=server.model_name,
            created=server.created,
            root=server.target.ref,
            max_model_len=server.target.max_context,
        )
        return ModelList(data=[card])

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        prepared = server.completion(body, _drift_key(request))
        stream = server.open(prepared, arrival)
        header = responses.Header.new("cmpl", int(time.time()), server.model_name)
        if body.stream:
            events = responses.completion_events(header, stream, prepared.prompt_tokens, body.include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return _json(
            await _unless_disconnected(request, responses.completion(header, stream, prepared.prompt_tokens))
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        prepared = server.chat(body, _drift_key(request))
        stream = server.open(prepared, arrival)
        header = responses.Header.new("chatcmpl", int(time.time()), server.model_name)
        if body.stream:
            events = responses.chat_events(header, stream, prepared.prompt_tokens, body.include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return _json(
            await _unless_disconnected(request, responses.chat(header, stream, prepared.prompt_tokens))
        )

    return app


def _drift_key(request: Request) -> DriftKey:
    try:
        return key_of(request.headers.get(TENANT_HEADER), request.headers.get(WORKLOAD_HEADER))
    except ValueError as exc:
        raise InvalidRequest(400, str(exc)) from None


def _json(body: BaseModel | None) -> Response:
    if body is None:
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it
    return JSONResponse(body.model_dump(mode="json"))


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None if the client disconnected first: then ``work`` is cancelled,
    and so are its rows. (Starlette itself cancels a streaming response whose client left.)"""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        finished = task.done()
        if not finished:
            task.cancel()
    return task.result() if finished else None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def serve(engine: Engine | Mapping[str, Engine], options: ServerOptions) -> None:
    """`specops serve engine`: run the server under uvicorn until SIGTERM / SIGINT."""
    import uvicorn
    from prometheus_client import disable_created_metrics

    # No `_created` series beside each counter and histogram, as vLLM's /metrics (this process
    # serves one registry, the server's).
    disable_created_metrics()
    server = EngineServer(engine, options)
    config = uvicorn.Config(
        create_app(server),
        host=options.host,
        port=options.port,
        timeout_graceful_shutdown=int(GRACE_S),
        log_config=None,  # the process's logging (specops serve configures it)
    )
    uvicorn.Server(config).run()
