"""The request body limit: a body over `gateway_max_body_bytes` is a 413, refused before it is
read into memory (a 50 MB body once took the gateway from 77 MB to 338 MB)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specops_schemas.api import Problem
from specops_services.gateway.problems import problem_response


class BodyLimit:
    """ASGI middleware: 413 on a declared Content-Length over the limit, at once; a chunked
    body is counted as it arrives, and past the limit the app is told the client left and
    whatever it answers is replaced by the 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        over = False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def answered(message: Message) -> None:
            if not over:
                await send(message)

        await self.app(scope, counted, answered)
        if over:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = Problem(
            type="urn:specops:problem:body-too-large",
            title="Content Too Large",
            status=413,
            detail=f"the request body is over {self.max_bytes} bytes, this gateway's limit",
            instance=scope["path"],
        )
        await problem_response(body)(scope, receive, send)
