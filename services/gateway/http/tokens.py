"""Issuing API tokens: a random secret shown once, stored only as its sha256."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from specops_schemas.catalog import Role
from specops_services.gateway.http import credentials, params
from specops_services.gateway.http import db as http_db
from specplatform.db import connect, tenant_transaction
from specplatform.tenant_signature import UNCLAIMED_TENANT


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token_id: str
    tenant_id: str
    role: Role
    secret: str  # the bearer token; not recoverable once this object is gone


async def issue_token(dsn: str, *, tenant_id: str, role: Role, name: str | None = None) -> IssuedToken:
    """Create a token for `tenant_id` (creating the tenant on first use)."""
    _require_tenant_id(tenant_id)
    secret = credentials.new_token()
    token_id = "tok_" + secrets.token_hex(8)
    async with await connect(dsn) as conn, tenant_transaction(conn, tenant_id):
        await http_db.create_token(
            conn,
            token_id=token_id,
            tenant_id=tenant_id,
            role=role,
            secret_sha256=credentials.hash_token(secret),
            name=name,
        )
    return IssuedToken(token_id=token_id, tenant_id=tenant_id, role=role, secret=secret)


async def ensure_tenant(dsn: str, tenant_id: str) -> None:
    """Create the tenant's record if it has none (an upstream system's tenant needs one)."""
    _require_tenant_id(tenant_id)
    async with await connect(dsn) as conn, conn.transaction():
        await http_db.ensure_tenant(conn, tenant_id)


def _require_tenant_id(tenant_id: str) -> None:
    if not params.is_spec_id(tenant_id):
        raise ValueError(f"invalid tenant id {tenant_id!r}: use 1-128 of A-Z a-z 0-9 _ -")
    if tenant_id == UNCLAIMED_TENANT:
        raise ValueError(
            f"tenant id {tenant_id!r} is reserved: the engine server's requests that name no tenant"
        )
