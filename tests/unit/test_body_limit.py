"""The shared body limit: a body over the limit is refused with the service's own refusal,
whether its length is declared or it arrives in chunks, and whichever way the route reads it."""

from __future__ import annotations

from collections.abc import Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Scope

from specplatform.body_limit import BodyLimit

LIMIT = 1000


def refusal(scope: Scope, max_bytes: int) -> ASGIApp:
    return JSONResponse({"refused": max_bytes}, status_code=413)


async def streamed(request: Request) -> Response:
    size = 0
    async for chunk in request.stream():  # raises ClientDisconnect past the limit
        size += len(chunk)
    return JSONResponse({"size": size})


async def whole(request: Request) -> Response:
    return JSONResponse({"size": len(await request.body())})


def client() -> TestClient:
    app = Starlette(
        routes=[Route("/stream", streamed, methods=["POST"]), Route("/whole", whole, methods=["POST"])]
    )
    return TestClient(BodyLimit(app, LIMIT, refusal))


def chunks(total: int, size: int = 300) -> Iterator[bytes]:
    while total > 0:
        yield b"x" * min(size, total)
        total -= size


def test_a_body_within_the_limit_reaches_the_route() -> None:
    with client() as c:
        for path in ("/stream", "/whole"):
            assert c.post(path, content=b"x" * LIMIT).json() == {"size": LIMIT}
            assert c.post(path, content=chunks(LIMIT)).json() == {"size": LIMIT}


def test_an_oversized_body_is_refused_however_it_comes_and_however_it_is_read() -> None:
    with client() as c:
        for path in ("/stream", "/whole"):
            declared = c.post(path, content=b"x" * (LIMIT + 1))
            chunked = c.post(path, content=chunks(50 * LIMIT))
            for answer in (declared, chunked):
                assert (answer.status_code, answer.json()) == (413, {"refused": LIMIT}), path
