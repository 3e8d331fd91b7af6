"""All of the security service's SQL (017_security, 019_head_usage): the tenants' policies,
their monthly usage and the training seconds already counted per head.

Callers hold a transaction acting for the tenant (`specbus.process_once` for the event's
tenant): the tables are bound by row-level security for their owner too, so these functions
see that tenant's rows only.
"""

from __future__ import annotations

from datetime import date

from psycopg.types.json import Jsonb

from specops_schemas.security import SecurityPolicy
from specplatform.db import Connection


async def lock_policy(conn: Connection, tenant_id: str) -> None:
    """Hold the tenant's policy until the transaction ends (a tenant that never set one has no
    row to lock, hence an advisory lock)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('security-policy:' || %s, 0))", (tenant_id,)
    )


async def policy(conn: Connection, tenant_id: str) -> SecurityPolicy | None:
    """The tenant's policy as last set; None if it never set one (the default applies)."""
    cursor = await conn.execute("SELECT policy FROM security_policies WHERE tenant_id = %s", (tenant_id,))
    row = await cursor.fetchone()
    return None if row is None else SecurityPolicy.model_validate(row["policy"])


async def save_policy(conn: Connection, new: SecurityPolicy) -> None:
    await conn.execute(
        """
        INSERT INTO security_policies (tenant_id, version, policy, updated_at)
        VALUES (%s, %s, %s, coalesce(%s, now()))
        ON CONFLICT (tenant_id) DO UPDATE
            SET version = EXCLUDED.version, policy = EXCLUDED.policy, updated_at = EXCLUDED.updated_at
        """,
        (new.tenant_id, new.version, Jsonb(new.model_dump(mode="json")), new.updated_at),
    )


async def add_usage(
    conn: Connection, tenant_id: str, month: date, seconds: float
) -> tuple[float, float | None]:
    """Add `seconds` to the tenant's month; its total now and the budget already announced exhausted."""
    cursor = await conn.execute(
        """
        INSERT INTO security_usage (tenant_id, month, used_s) VALUES (%s, %s, %s)
        ON CONFLICT (tenant_id, month) DO UPDATE SET used_s = security_usage.used_s + EXCLUDED.used_s
        RETURNING used_s, exhausted_budget_s
        """,
        (tenant_id, month, seconds),
    )
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError(f"the usage of tenant {tenant_id} in {month} was not written")
    return float(row["used_s"]), row["exhausted_budget_s"]


async def mark_announced(conn: Connection, tenant_id: str, month: date, budget_s: float) -> None:
    """Note that the month's exhaustion of `budget_s` was published (once per month and budget)."""
    await conn.execute(
        "UPDATE security_usage SET exhausted_budget_s = %s WHERE tenant_id = %s AND month = %s",
        (budget_s, tenant_id, month),
    )


async def advance_head(conn: Connection, tenant_id: str, head_id: str, elapsed_s: float) -> float:
    """Note that the head has trained ``elapsed_s`` seconds in all; the seconds not counted
    before (0 when an earlier event reported as much or more).

    The epoch and trained consumers count one head at once: the row is made to exist first
    (an insert of the same head waits for the other's to commit), then locked, so the second
    reads what the first counted."""
    await conn.execute(
        """INSERT INTO security_head_usage (tenant_id, head_id, counted_s) VALUES (%s, %s, 0)
           ON CONFLICT (tenant_id, head_id) DO NOTHING""",
        (tenant_id, head_id),
    )
    cursor = await conn.execute(
        "SELECT counted_s FROM security_head_usage WHERE tenant_id = %s AND head_id = %s FOR UPDATE",
        (tenant_id, head_id),
    )
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError(f"the training seconds of head {head_id} were not written")
    counted = float(row["counted_s"])
    if elapsed_s <= counted:
        return 0.0
    await conn.execute(
        "UPDATE security_head_usage SET counted_s = %s WHERE tenant_id = %s AND head_id = %s",
        (elapsed_s, tenant_id, head_id),
    )
    return elapsed_s - counted
