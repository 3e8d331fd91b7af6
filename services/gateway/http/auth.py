"""Authentication (a bearer token, or the console's session cookie) and role checks, as FastAPI
dependencies; the console's server-side sessions (opened at sign-in, ended at sign-out)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from specops_schemas.catalog import Role
from specops_services.gateway.http import db as http_db
from specops_services.gateway.http.credentials import (
    CSRF_COOKIE,
    CSRF_HEADER,
    SESSION_COOKIE,
    bearer_token,
    csrf_refusal,
    has_role,
    hash_token,
    new_session_id,
)
from specops_services.gateway.http.problems import problem, unauthorized
from specplatform.db import Pool, role_transaction, tenant_transaction

# auto_error=False: a missing header must become our 401 problem (with its challenge),
# not FastAPI's plain 403. The schemes still document the two ways in, in the OpenAPI.
_bearer = HTTPBearer(auto_error=False, description="An API token from `specops tokens create`.")
_session = APIKeyCookie(
    name=SESSION_COOKIE,
    auto_error=False,
    description="The console's session (`POST /ui/sign-in`). POST, PUT, PATCH and DELETE with it "
    f"need the `{CSRF_HEADER}` header equal to the `{CSRF_COOKIE}` cookie (403 otherwise).",
)
CSRF_REFUSED = "urn:specops:problem:csrf"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's id, tenant and role; through the console, the hash of the
    session too (an open event stream ends with it)."""

    token_id: str
    tenant_id: str
    role: Role
    session_sha256: str | None = None


def pool_of(request: Request) -> Pool:
    pool: Pool = request.app.state.pool
    return pool


async def principal_of(pool: Pool, token: str) -> Principal | None:
    """The live token's principal, or None for a token unknown or revoked."""
    async with pool.connection() as conn, role_transaction(conn, http_db.TOKEN_READER):
        row = await http_db.find_token(conn, hash_token(token))
    return None if row is None else _principal(row)


def _principal(row: http_db.TokenRow) -> Principal:
    return Principal(token_id=row.token_id, tenant_id=row.tenant_id, role=row.role)


async def session_principal(request: Request, session_id: str) -> Principal | None:
    """The principal of a live console session (its token live, not idle or expired), or None."""
    idle_s = request.app.state.settings.gateway_console_session_idle_s
    session_sha256 = hash_token(session_id)
    async with pool_of(request).connection() as conn, role_transaction(conn, http_db.SESSION_KEEPER):
        row = await http_db.touch_session(conn, session_sha256, idle_s)
    if row is None:
        return None
    return Principal(
        token_id=row.token_id, tenant_id=row.tenant_id, role=row.role, session_sha256=session_sha256
    )


async def open_session(request: Request, principal: Principal) -> str:
    """A new console session of the principal's token; its id, for the cookie."""
    session_id = new_session_id()
    max_age_s = request.app.state.settings.gateway_console_session_max_s
    async with pool_of(request).connection() as conn, tenant_transaction(conn, principal.tenant_id):
        await http_db.open_session(
            conn,
            session_sha256=hash_token(session_id),
            token_id=principal.token_id,
            tenant_id=principal.tenant_id,
            max_age_s=max_age_s,
        )
    return session_id


async def end_session(request: Request, session_id: str) -> None:
    async with pool_of(request).connection() as conn, role_transaction(conn, http_db.SESSION_KEEPER):
        await http_db.end_session(conn, hash_token(session_id))


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    session: Annotated[str | None, Depends(_session)],
) -> Principal:
    """The bearer token's principal; without an Authorization header, the session cookie's, whose
    unsafe requests must also pass the CSRF check."""
    authorization = request.headers.get("authorization")
    if authorization is None and session:
        principal = await session_principal(request, session)
        if principal is None:
            raise unauthorized(
                "the console session has ended (signed out, expired or its token revoked): sign in again",
                invalid=True,
            )
        refusal = csrf_refusal(
            request.method, request.cookies.get(CSRF_COOKIE), request.headers.get(CSRF_HEADER)
        )
        if refusal is not None:
            raise problem(403, refusal, type=CSRF_REFUSED)
        return principal
    token = bearer_token(authorization)
    if credentials is None or token is None:
        raise unauthorized("send `Authorization: Bearer <token>`", invalid=False)
    principal = await principal_of(pool_of(request), token)
    if principal is None:
        raise unauthorized("the bearer token is unknown or revoked", invalid=True)
    return principal


def require(role: Role) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that lets through callers whose role is at least `role`."""

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not has_role(principal.role, role):
            raise problem(
                403, f"this needs the {role.value} role or above; the token has {principal.role.value}"
            )
        return principal

    return check


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Developer = Annotated[Principal, Depends(require(Role.DEVELOPER))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
