"""A JSON body must say so: a body sent to a route that takes JSON, without a JSON
``Content-Type``, is refused with a 415 that says which header to add. `curl -d` sends
``application/x-www-form-urlencoded``, and FastAPI then validated the raw bytes into a 422 that
never named the header. A route that takes no JSON body (an HTML form's, one that streams its
body itself) is left alone: the route decides, by its body parameter, not a list of paths.

``require_json`` is an app-wide dependency (``FastAPI(dependencies=[Depends(require_json)])``):
it runs before the body is validated. It raises NotJson, which each service answers in its own
error shape, as it answers the body limit's refusal.
"""

from __future__ import annotations

from fastapi import Request, params
from fastapi.routing import APIRoute

HINT = (
    "send the JSON body with the header `Content-Type: application/json` "
    "(curl: -H 'Content-Type: application/json')"
)
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class NotJson(Exception):
    """A body without a JSON media type sent to a route that takes JSON (a 415)."""

    def __init__(self, content_type: str | None) -> None:
        self.content_type = content_type
        sent = f"`{content_type}`" if content_type else "no Content-Type"
        super().__init__(f"the request body must be JSON, and was sent with {sent}: {HINT}")


def is_json(content_type: str | None) -> bool:
    """``application/json`` or a ``+json`` type, whatever its parameters (charset)."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def takes_json(route: object) -> bool:
    """Whether FastAPI reads the route's body as JSON: a body parameter that is not a form."""
    if not isinstance(route, APIRoute) or route.body_field is None:
        return False
    # FastAPI's own test for a form body (fastapi.routing.get_request_handler).
    return not isinstance(route.body_field.field_info, params.Form)


async def require_json(request: Request) -> None:
    if request.method not in WITH_BODY or not takes_json(request.scope.get("route")):
        return
    content_type = request.headers.get("content-type")
    if not is_json(content_type) and await request.body():
        raise NotJson(content_type)
