"""The request body limit of an HTTP service (the gateway, the engine server): a body over the
limit is refused before it is read into memory. A 50 MB body once took the gateway from 77 MB
to 338 MB, and the engine server tokenized one for 53 s; a limit checked after the body is read
protects neither. Each service writes the refusal in its own error shape (``refusal``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The 413 answer to a request over ``max_bytes``: an ASGI app (a Starlette Response is one).
Refusal = Callable[[Scope, int], ASGIApp]


class BodyLimit:
    """ASGI middleware: a declared Content-Length over the limit is refused at once, unread; a
    chunked body is counted as it arrives, and past the limit the app is told the client left
    and whatever it answers is replaced by the refusal. A route that streams its body to disk
    may have a limit of its own (``per_path``)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        refusal: Refusal,
        per_path: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.refusal = refusal
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.per_path.get(scope["path"], self.default_max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self.refusal(scope, max_bytes)(scope, receive, send)
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

        try:
            await self.app(scope, counted, answered)
        except Exception:
            # A route that reads the body itself (request.stream()) raises ClientDisconnect
            # at the disconnect it was told of; past the limit that is the refusal's case.
            if not over:
                raise
        if over:
            await self.refusal(scope, max_bytes)(scope, receive, send)
