"""What the security endpoints do (GET and PUT security/policy), and the checks the gateway's
POSTs make against the tenant's policy.

The security service owns the policies; the gateway asks it for a change with a
`security.policy_requested` (through the outbox) and learns the result from its own read
model, which the security projector folds from `security.policy_changed`. A PUT waits for
that fold (`gateway_policy_wait_s`): 200 with the new policy, or 202 if it has not landed
yet. Every refusal for the policy's sake is a `Refused`: a problem linking the ADR (F-S5),
and a `security.refused` (audited, F-S4) that `recording` adds once the request's own
transaction has rolled back — a caller below admin who tries a change (403), a measuring
POST (runs, tune-sessions, heads/train) over the tenant's GPU budget (429), and for a
tenant that opts out of speculation a head to train (403) or a winner to apply (409).
"""

from __future__ import annotations

import asyncio
import time

from specbus import outbox
from specbus.envelope import new_event
from specops_schemas.base import utc_now
from specops_schemas.catalog import Role
from specops_schemas.security import (
    OPT_OUT_REASON,
    PolicyChangeRequested,
    PolicySettings,
    SecurityPolicy,
    month_of,
)
from specops_services.gateway import idempotency
from specops_services.gateway.http import credentials
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.refusals import Refused, recording
from specops_services.gateway.results import PRODUCER
from specops_services.gateway.security import db as security_db
from specops_services.gateway.security import logic as security_logic
from specplatform.db import Connection, Pool, tenant_transaction

POLL_S = 0.1


async def tenant_policy(conn: Connection, tenant_id: str) -> SecurityPolicy:
    """The tenant's policy as the read model has it (the default when it never set one)."""
    return await security_db.policy(conn, tenant_id) or SecurityPolicy.default(tenant_id)


async def read_policy(pool: Pool, principal: Principal) -> SecurityPolicy:
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        return await tenant_policy(conn, principal.tenant_id)


async def put_policy(
    pool: Pool, principal: Principal, settings: PolicySettings, *, wait_s: float
) -> idempotency.Reply:
    """Ask the security service for the tenant's new policy; the policy once applied (200), or 202."""
    tenant = principal.tenant_id
    if not credentials.has_role(principal.role, Role.ADMIN):
        reason = f"changing the security policy needs the admin role; the token has {principal.role.value}"
        async with recording(pool, principal):
            raise Refused(403, reason, type=security_logic.POLICY_REFUSED, action="policy.update")
    requested = new_event(
        PolicyChangeRequested(tenant_id=tenant, settings=settings, requested_by=principal.token_id),
        tenant_id=tenant,
        correlation_id=tenant,
        producer=PRODUCER,
    )
    async with pool.connection() as conn, tenant_transaction(conn, tenant):
        await outbox.add(conn, requested)
    location = {"Location": security_logic.POLICY_PATH}
    deadline = time.monotonic() + wait_s
    while True:
        async with pool.connection() as conn, tenant_transaction(conn, tenant):
            applied = await security_db.applied(conn, tenant, requested.event_id)
            current = applied or await tenant_policy(conn, tenant)
        if applied is not None:
            return idempotency.Reply(200, applied.model_dump(mode="json"), location)
        if time.monotonic() >= deadline:
            return idempotency.Reply(202, current.model_dump(mode="json"), location)
        await asyncio.sleep(POLL_S)


async def require_budget(conn: Connection, principal: Principal, action: str) -> None:
    """`Refused` 429 (with the budget, the month's use and `Retry-After` until it resets) when
    the tenant's GPU budget is spent: nothing of the request starts. A run already started
    finishes; an opted-out tenant's request measures nothing and is never refused for it.

    Read in the caller's tenant transaction (`conn`, under `idempotency.keyed`), after its
    idempotent replay and winner cache, which cost no GPU time."""
    now = utc_now()
    tenant = principal.tenant_id
    policy = await tenant_policy(conn, tenant)
    exhausted = await security_db.exhaustion(conn, tenant, month_of(now))
    over = security_logic.over_budget(policy, exhausted, now)
    if over is None:
        return
    refused = Refused(
        429,
        over.detail(),
        type=security_logic.OVER_BUDGET,
        action=action,
        budget_s=over.budget_s,
        used_s=over.used_s,
        resets_at=over.resets_at.isoformat(),
    )
    refused.headers["Retry-After"] = str(over.retry_after_s(now))
    raise refused


async def require_speculation(conn: Connection, principal: Principal, action: str, *, status: int) -> None:
    """`Refused` (`status`) when the tenant's policy opts out of speculation (F-S3): a request
    that exists only to speculate (training a head, applying a winner's flags) is not taken."""
    if await speculation_disabled(conn, principal.tenant_id):
        raise Refused(status, OPT_OUT_REASON, type=security_logic.SPECULATION_DISABLED, action=action)


async def speculation_disabled(conn: Connection, tenant_id: str) -> bool:
    """Whether the tenant's policy opts out of speculation (F-S3): nothing speculative is served."""
    return (await tenant_policy(conn, tenant_id)).speculation_opt_out
