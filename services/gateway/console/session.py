"""The browser's session: sign-in opens a server-side session and sets its cookie (a random
session id, never the API token; HttpOnly and SameSite=Strict, so no script reads it and no
other site's request carries it) and the CSRF cookie the console's script echoes
(auth.authenticate checks both on API calls). Signing out ends the session on the server, so a
copied cookie stops working too."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from specops_services.gateway.http import credentials
from specops_services.gateway.http.auth import Principal, end_session, open_session, session_principal


async def page_principal(request: Request) -> Principal | None:
    """Who the session cookie signs in, or None (then the page sends the browser to sign in)."""
    session_id = request.cookies.get(credentials.SESSION_COOKIE)
    return None if not session_id else await session_principal(request, session_id)


async def form_field(request: Request, name: str) -> str:
    """A field of an `application/x-www-form-urlencoded` body ('' when absent)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    return fields.get(name, [""])[0]


def set_csrf(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        credentials.CSRF_COOKIE, value, httponly=False, samesite="strict", secure=_secure(request), path="/"
    )


def form_csrf(request: Request) -> str:
    """The CSRF value of a form shown before sign-in: the browser's, or a new one (then the page
    sets it with `set_csrf`), so another site cannot sign the browser in with its own token."""
    return request.cookies.get(credentials.CSRF_COOKIE) or credentials.new_csrf_token()


async def signed_in(request: Request, principal: Principal, to: str) -> RedirectResponse:
    """See other `to`, with a new session's cookie set and a fresh CSRF cookie (Secure over https)."""
    session_id = await open_session(request, principal)
    response = RedirectResponse(to, status_code=303)
    response.set_cookie(
        credentials.SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )
    set_csrf(request, response, credentials.new_csrf_token())
    return response


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


async def signed_out(request: Request, to: str) -> RedirectResponse:
    """See other `to`, the session ended on the server and its cookies cleared."""
    session_id = request.cookies.get(credentials.SESSION_COOKIE)
    if session_id:
        await end_session(request, session_id)
    response = RedirectResponse(to, status_code=303)
    for name in (credentials.SESSION_COOKIE, credentials.CSRF_COOKIE):
        response.delete_cookie(name, path="/", samesite="strict")
    return response


async def form_csrf_refusal(request: Request) -> str | None:
    """The CSRF check of the console's own form POSTs (the token rides in a hidden field)."""
    field = await form_field(request, "csrf")
    return credentials.csrf_refusal(request.method, request.cookies.get(credentials.CSRF_COOKIE), field)
