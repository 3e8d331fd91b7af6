"""The gateway's SQL of its security read model (017_security): the tenants' policies and their
months' budget exhaustions, as the security service's events told them. Callers hold a tenant
transaction."""

from __future__ import annotations

from datetime import date

from psycopg.types.json import Jsonb

from specops_schemas.security import BudgetExhausted, SecurityPolicy
from specplatform.db import Connection


async def policy(conn: Connection, tenant_id: str) -> SecurityPolicy | None:
    cur = await conn.execute(
        "SELECT policy FROM gateway_security_policies WHERE tenant_id = %s", (tenant_id,)
    )
    row = await cur.fetchone()
    return None if row is None else SecurityPolicy.model_validate(row["policy"])


async def applied(conn: Connection, tenant_id: str, requested_event_id: str) -> SecurityPolicy | None:
    """The policy a `security.policy_requested` led to, once folded (None: not yet, or superseded)."""
    cur = await conn.execute(
        "SELECT policy FROM gateway_security_policies WHERE tenant_id = %s AND requested_event_id = %s",
        (tenant_id, requested_event_id),
    )
    row = await cur.fetchone()
    return None if row is None else SecurityPolicy.model_validate(row["policy"])


async def save_policy(conn: Connection, new: SecurityPolicy, requested_event_id: str | None) -> bool:
    """Fold a policy in unless a newer version is there already; whether it moved the row."""
    cur = await conn.execute(
        """
        INSERT INTO gateway_security_policies (tenant_id, version, policy, requested_event_id)
        VALUES (%s, %s, %s, %s)
        ON CONFLICT (tenant_id) DO UPDATE
            SET version = EXCLUDED.version, policy = EXCLUDED.policy,
                requested_event_id = EXCLUDED.requested_event_id
            WHERE gateway_security_policies.version < EXCLUDED.version
        """,
        (new.tenant_id, new.version, Jsonb(new.model_dump(mode="json")), requested_event_id),
    )
    return cur.rowcount == 1


async def save_exhaustion(conn: Connection, tenant_id: str, exhausted: BudgetExhausted, month: date) -> bool:
    """Fold a month's exhaustion in (the one of the largest count wins); whether it moved the row."""
    cur = await conn.execute(
        """
        INSERT INTO gateway_budget_exhaustions (tenant_id, month, budget_s, used_s, resets_at)
        VALUES (%s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id, month) DO UPDATE
            SET budget_s = EXCLUDED.budget_s, used_s = EXCLUDED.used_s, resets_at = EXCLUDED.resets_at
            WHERE gateway_budget_exhaustions.used_s < EXCLUDED.used_s
        """,
        (tenant_id, month, exhausted.budget_s, exhausted.used_s, exhausted.resets_at),
    )
    return cur.rowcount == 1


async def exhaustion(conn: Connection, tenant_id: str, month: date) -> BudgetExhausted | None:
    """The month's last announced exhaustion, or None while the budget holds."""
    cur = await conn.execute(
        """SELECT budget_s, used_s, resets_at FROM gateway_budget_exhaustions
           WHERE tenant_id = %s AND month = %s""",
        (tenant_id, month),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return BudgetExhausted(
        tenant_id=tenant_id, budget_s=row["budget_s"], used_s=row["used_s"], resets_at=row["resets_at"]
    )
