"""The engine server's HTTP app: OpenAI's `/v1/models`, `/v1/completions` and
`/v1/chat/completions`, vLLM's `/tokenize`, `/detokenize` and `/version`, `/health` and
Prometheus `/metrics`.

Every error is OpenAI's JSON (`{"error": {"message", "type", "param", "code"}}`), which the
`openai` client raises as BadRequestError (400), NotFoundError (404), ...: a body that fails
validation is a 400, as OpenAI answers it, not FastAPI's 422; a body FastAPI cannot parse
(malformed, or nested past the JSON decoder's recursion limit, which FastAPI raised as a bare
HTTPException) a 400; an unknown URL a 404 and a wrong method a 405; a JSON body without a JSON
`Content-Type` a 415 that names the header (specplatform.json_body); a body over
``ServerOptions.max_body_bytes`` a 413, refused before it is read (specplatform.body_limit);
anything unexpected a 500 (logged), never FastAPI's `{"detail": ...}`.

A request speaks for the tenant it names only if tenant_auth takes its claim (a trusted
proxy's signature): otherwise a 401 or 403, before its body is validated or tokenized. With
live workload summaries on (ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT), an accepted request's prompts
are handed to their thread (live_workload_events.py) once it is submitted; nothing waits for it.

Shutdown (SIGTERM, SIGINT): uvicorn stops accepting connections and lets the requests under
way finish for up to ``GRACE_S``, then cancels them (which cancels their rows); the lifespan
then stops the worker, which fails whatever is left, and joins its thread.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import Scope

from speccore.engine import Engine
from specops_services.engine import responses, tokenizing
from specops_services.engine.drift import TENANT_HEADER, WORKLOAD_HEADER, DriftKey, key_of
from specops_services.engine.live_workload_events import request_texts
from specops_services.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    ErrorResponse,
    ModelCard,
    ModelList,
    error_response,
)
from specops_services.engine.serving import (
    EngineFailure,
    EngineServer,
    InvalidRequest,
    Prepared,
    ServerOptions,
)
from specops_services.engine.tenant_auth import Claim, TenantRefused
from specops_services.engine.tokenizing import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from specplatform.body_limit import BodyLimit
from specplatform.json_body import NotJson, require_json
from specplatform.tenant_signature import SIGNATURE_HEADER

log = logging.getLogger(__name__)

GRACE_S = 30.0  # how long requests under way may finish after SIGTERM
JOIN_S = 60.0  # how long shutdown waits for the worker's step under way
CLIENT_CLOSED = 499  # nginx's status of a request whose client went away

T = TypeVar("T", bound=BaseModel)
B = TypeVar("B", CompletionRequest, ChatCompletionRequest)


def create_app(server: EngineServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if server.bus is not None:
            await server.bus.start()
        if server.policy_feed is not None:
            await server.policy_feed.start()
        server.worker.start()
        if server.live_workload is not None:
            server.live_workload.start()
        log.info("serving %s (%s) as %r", server.target.ref, server.method, server.model_name)
        try:
            yield
        finally:
            await asyncio.to_thread(server.worker.stop, JOIN_S)
            server.tokenizing.shutdown(wait=False, cancel_futures=True)
            if server.live_workload is not None:
                await asyncio.to_thread(server.live_workload.stop, JOIN_S)
            if server.bus is not None:
                await server.bus.stop()
            if server.policy_feed is not None:
                await server.policy_feed.stop()

    app = FastAPI(title="specops engine", lifespan=lifespan, dependencies=[Depends(require_json)])
    app.state.server = server
    app.add_middleware(BodyLimit, max_bytes=server.options.max_body_bytes, refusal=_too_large)

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse(error_response(exc.status, str(exc), param=exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _unvalidated(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = [str(part) for part in first["loc"] if part != "body"]
        message = f"{'.'.join(where)}: {first['msg']}" if where else str(first["msg"])
        return JSONResponse(error_response(400, message, param=where[-1] if where else None), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, _http_message(request, exc), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, and uvicorn logs it with its traceback.
        return _error(500, f"internal server error ({type(exc).__name__})")

    @app.exception_handler(NotJson)
    async def _not_json(request: Request, exc: NotJson) -> JSONResponse:
        return _error(415, str(exc))

    @app.exception_handler(TenantRefused)
    async def _refused(request: Request, exc: TenantRefused) -> JSONResponse:
        return JSONResponse(error_response(exc.status, str(exc)), status_code=exc.status)

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

    @app.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=importlib.metadata.version("specops"))

    @app.post("/tokenize")
    async def tokenize(
        body: TokenizeCompletionRequest | TokenizeChatRequest, key: TenantKey
    ) -> TokenizeResponse:
        if body.model is not None:
            server.check_model(body.model)
        return await asyncio.get_running_loop().run_in_executor(
            server.tokenizing, tokenizing.tokenize, server.target, body
        )

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, key: TenantKey) -> DetokenizeResponse:
        if body.model is not None:
            server.check_model(body.model)
        return await asyncio.get_running_loop().run_in_executor(
            server.tokenizing, tokenizing.detokenize, server.target, body
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request, key: TenantKey) -> Response:
        arrival = time.monotonic()
        prepared = await _off_loop(server, server.completion, body, key)
        stream = server.open(prepared, arrival)
        _summarize(server, body, key)
        header = responses.Header.new("cmpl", int(time.time()), server.model_name)
        if body.stream:
            events = responses.completion_events(
                header, stream, prepared.prompt_tokens, body.include_usage, body.continuous_usage
            )
            return StreamingResponse(events, media_type="text/event-stream")
        return _json(
            await _unless_disconnected(request, responses.completion(header, stream, prepared.prompt_tokens))
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request, key: TenantKey) -> Response:
        arrival = time.monotonic()
        prepared = await _off_loop(server, server.chat, body, key)
        stream = server.open(prepared, arrival)
        _summarize(server, body, key)
        header = responses.Header.new("chatcmpl", int(time.time()), server.model_name)
        if body.stream:
            events = responses.chat_events(
                header, stream, prepared.prompt_tokens, body.include_usage, body.continuous_usage
            )
            return StreamingResponse(events, media_type="text/event-stream")
        return _json(
            await _unless_disconnected(request, responses.chat(header, stream, prepared.prompt_tokens))
        )

    return app


async def _authenticated_key(request: Request) -> DriftKey:
    """The request's tenant and workload; TenantRefused unless its tenant claim is taken."""
    server: EngineServer = request.app.state.server
    tenant = request.headers.get(TENANT_HEADER)
    workload = request.headers.get(WORKLOAD_HEADER)
    try:
        key = key_of(tenant, workload)
    except ValueError as exc:
        raise InvalidRequest(400, str(exc)) from None
    if tenant:  # no claim: the default tenant
        claim = Claim(
            tenant=key.tenant,
            workload=workload or "",
            signature=request.headers.get(SIGNATURE_HEADER),
            method=request.method,
            path=request.url.path,
            body=await request.body(),
        )
        server.tenants.check(claim, server.security.policy(key.tenant).tier, time.time())
    return key


# A dependency, so that a refused claim is answered before the body is validated.
TenantKey = Annotated[DriftKey, Depends(_authenticated_key)]


async def _off_loop(
    server: EngineServer, prepare: Callable[[B, DriftKey], Prepared], body: B, key: DriftKey
) -> Prepared:
    """``prepare(body, key)`` (tokenizing) on the server's tokenizer thread."""
    return await asyncio.get_running_loop().run_in_executor(server.tokenizing, prepare, body, key)


def _summarize(server: EngineServer, body: CompletionRequest | ChatCompletionRequest, key: DriftKey) -> None:
    """Hand the request's prompts to the live workload summary (with the flag on), unawaited."""
    if server.live_workload is not None:
        server.live_workload.offer(key.tenant, request_texts(body))


def _too_large(scope: Scope, max_bytes: int) -> Response:
    message = f"the request body is over {max_bytes} bytes, this server's limit (--max-body-bytes)"
    return JSONResponse(error_response(413, message), status_code=413)


def _http_message(request: Request, exc: HTTPException) -> str:
    if exc.status_code == 404:
        return f"Invalid URL ({request.method} {request.url.path})"  # OpenAI's words
    if exc.status_code == 405:
        return f"{request.method} is not allowed on {request.url.path}"
    if exc.status_code == 400:
        # FastAPI's answer to a body its JSON decoder gave up on (nested past its recursion limit).
        return f"the request body could not be parsed as JSON ({exc.detail})"
    return str(exc.detail)


def _error(status: int, message: str, *, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An OpenAI error of a status the routes never raise themselves (no parameter, no code)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = ErrorResponse(error=ErrorBody(message=message, type=kind, param=None, code=None))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


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
