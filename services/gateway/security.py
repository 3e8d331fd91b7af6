"""What the security endpoints do (GET and PUT security/policy), and the checks the measuring
POSTs (runs, tune-sessions, heads/train) make against the tenant's policy.

The security service owns the policies; the gateway asks it for a change with a
`security.policy_requested` (through the outbox) and learns the result from its own read
model, which the security projector folds from `security.policy_changed`. A PUT waits for
that fold (`gateway_policy_wait_s`): 200 with the new policy, or 202 if it has not landed
yet. A caller below admin who tries a change gets a 403 and leaves a `security.refused`
(audited, F-S4), as does a measuring POST over the tenant's GPU budget (429) and a head to
train for a tenant that opts out of speculation (403).
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
    SecurityRefused,
    month_of,
)
from specops_services.gateway import logic, security_db, security_logic
from specops_services.gateway.auth import Principal
from specops_services.gateway.problems import problem
from specops_services.gateway.results import PRODUCER
from specplatform.db import Connection, Pool, tenant_transaction

POLL_S = 0.1


async def tenant_policy(conn: Connection, tenant_id: str) -> SecurityPolicy:
    """The tenant's policy as the read model has it (the default when it never set one)."""
    return security_logic.current_policy(await security_db.policy(conn, tenant_id), tenant_id)


async def read_policy(pool: Pool, principal: Principal) -> SecurityPolicy:
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        return await tenant_policy(conn, principal.tenant_id)


async def put_policy(
    pool: Pool, principal: Principal, settings: PolicySettings, *, wait_s: float
) -> logic.Reply:
    """Ask the security service for the tenant's new policy; the policy once applied (200), or 202."""
    tenant = principal.tenant_id
    if not logic.has_role(principal.role, Role.ADMIN):
        reason = f"changing the security policy needs the admin role; the token has {principal.role.value}"
        await refuse(pool, principal, "policy.update", reason)
        raise problem(403, reason, type=security_logic.POLICY_REFUSED)
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
            return logic.Reply(200, applied.model_dump(mode="json"), location)
        if time.monotonic() >= deadline:
            return logic.Reply(202, current.model_dump(mode="json"), location)
        await asyncio.sleep(POLL_S)


async def refuse(pool: Pool, principal: Principal, action: str, reason: str) -> None:
    """Record a refusal as a `security.refused` (committed on its own: the request itself fails)."""
    refused = new_event(
        SecurityRefused(
            tenant_id=principal.tenant_id, action=action, reason=reason, actor=principal.token_id
        ),
        tenant_id=principal.tenant_id,
        correlation_id=principal.tenant_id,
        producer=PRODUCER,
    )
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        await outbox.add(conn, refused)


async def require_budget(conn: Connection, pool: Pool, principal: Principal, action: str) -> None:
    """429 (with the budget, the month's use and `Retry-After` until it resets) when the tenant's
    GPU budget is spent: nothing of the request starts. A run already started finishes.

    Read in the caller's tenant transaction (`conn`), after its idempotent replay and winner
    cache, which cost no GPU time; the refusal is recorded on a connection of its own (`pool`),
    since the caller's transaction rolls back with the 429."""
    now = utc_now()
    tenant = principal.tenant_id
    policy = await tenant_policy(conn, tenant)
    exhausted = await security_db.exhaustion(conn, tenant, month_of(now))
    over = security_logic.over_budget(policy, exhausted)
    if over is None:
        return
    await refuse(pool, principal, action, over.detail())
    error = problem(
        429,
        over.detail(),
        type=security_logic.OVER_BUDGET,
        budget_s=over.budget_s,
        used_s=over.used_s,
        resets_at=over.resets_at.isoformat(),
    )
    error.headers["Retry-After"] = str(over.retry_after_s(now))
    raise error


async def require_speculation(pool: Pool, principal: Principal, action: str) -> None:
    """403 (and an audited refusal) when the tenant's policy opts out of speculation (F-S3): a
    request that exists only to speculate (training a head) is not taken."""
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        disabled = await speculation_disabled(conn, principal.tenant_id)
    if disabled:
        await refuse(pool, principal, action, OPT_OUT_REASON)
        raise problem(403, OPT_OUT_REASON, type=security_logic.SPECULATION_DISABLED)


async def speculation_disabled(conn: Connection, tenant_id: str) -> bool:
    """Whether the tenant's policy opts out of speculation (F-S3): nothing speculative is served."""
    return (await tenant_policy(conn, tenant_id)).speculation_disabled
