"""The browser's session: sign-in sets the session cookie (the API token itself, HttpOnly and
SameSite=Strict, so no script reads it and no other site's request carries it) and the CSRF
cookie the console's script echoes (auth.authenticate checks both on API calls)."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse

from specops_services.gateway import logic
from specops_services.gateway.auth import Principal, pool_of, principal_of


async def page_principal(request: Request) -> Principal | None:
    """Who the session cookie signs in, or None (then the page sends the browser to sign in)."""
    token = request.cookies.get(logic.SESSION_COOKIE)
    return None if not token else await principal_of(pool_of(request), token)


async def form_field(request: Request, name: str) -> str:
    """A field of an `application/x-www-form-urlencoded` body ('' when absent)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    return fields.get(name, [""])[0]


def signed_in(request: Request, token: str, to: str) -> RedirectResponse:
    """See other `to`, with the session's two cookies set (Secure over https)."""
    response = RedirectResponse(to, status_code=303)
    secure = request.url.scheme == "https"
    response.set_cookie(
        logic.SESSION_COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/"
    )
    response.set_cookie(
        logic.CSRF_COOKIE, logic.new_csrf_token(), httponly=False, samesite="strict", secure=secure, path="/"
    )
    return response


def signed_out(to: str) -> RedirectResponse:
    response = RedirectResponse(to, status_code=303)
    for name in (logic.SESSION_COOKIE, logic.CSRF_COOKIE):
        response.delete_cookie(name, path="/", samesite="strict")
    return response


async def form_csrf_refusal(request: Request) -> str | None:
    """The CSRF check of the console's own form POSTs (the token rides in a hidden field)."""
    field = await form_field(request, "csrf")
    return logic.csrf_refusal(request.method, request.cookies.get(logic.CSRF_COOKIE), field)
