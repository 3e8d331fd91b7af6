"""The request body limit: a body over `gateway_max_body_bytes` is a 413, refused before it is
read into memory (a 50 MB body once took the gateway from 77 MB to 338 MB). A route that
streams its body to disk (`POST datastores`) has a limit of its own instead (`per_path`)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specops_schemas.api import Problem
from specops_services.gateway.http.problems import problem_response


class BodyLimit:
    """ASGI middleware: 413 on a declared Content-Length over the limit, at once; a chunked
    body is counted as it arrives, and past the limit the app is told the client left and
    whatever it answers is replaced by the 413."""

    def __init__(self, app: ASGIApp, max_bytes: int, per_path: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.per_path.get(scope["path"], self.default_max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._refuse(scope, receive, send, max_bytes)
            return
        seen = 0
        over = False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def answered(message: Message) -> None:
            if not over:
                await send(message)

        await self.app(scope, counted, answered)
        if over:
            await self._refuse(scope, receive, send, max_bytes)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        body = Problem(
            type="urn:specops:problem:body-too-large",
            title="Content Too Large",
            status=413,
            detail=f"the request body is over {max_bytes} bytes, this gateway's limit",
            instance=scope["path"],
        )
        await problem_response(body)(scope, receive, send)
