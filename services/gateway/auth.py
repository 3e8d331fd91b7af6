"""Bearer-token authentication and role checks, as FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from specops_schemas.catalog import Role
from specops_services.gateway import db, logic
from specops_services.gateway.problems import problem, unauthorized
from specplatform.db import Pool, role_transaction

# auto_error=False: a missing header must become our 401 problem (with its challenge),
# not FastAPI's plain 403. The scheme still documents bearer auth in the OpenAPI.
_bearer = HTTPBearer(auto_error=False, description="An API token from `specops tokens create`.")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's id, tenant and role."""

    token_id: str
    tenant_id: str
    role: Role


def pool_of(request: Request) -> Pool:
    pool: Pool = request.app.state.pool
    return pool


async def authenticate(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    token = logic.bearer_token(request.headers.get("authorization"))
    if credentials is None or token is None:
        raise unauthorized("send `Authorization: Bearer <token>`", invalid=False)
    async with pool_of(request).connection() as conn, role_transaction(conn, db.TOKEN_READER):
        row = await db.find_token(conn, logic.hash_token(token))
    if row is None:
        raise unauthorized("the bearer token is unknown or revoked", invalid=True)
    return Principal(token_id=row.token_id, tenant_id=row.tenant_id, role=row.role)


def require(role: Role) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that lets through callers whose role is at least `role`."""

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not logic.has_role(principal.role, role):
            raise problem(
                403, f"this needs the {role.value} role or above; the token has {principal.role.value}"
            )
        return principal

    return check


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Developer = Annotated[Principal, Depends(require(Role.DEVELOPER))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
