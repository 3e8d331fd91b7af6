"""The tenant a transaction acts for, which the database's row-level security reads.

Every table with a tenant_id shows the services' role (specops_app) only the rows of
`current_tenant()`, the transaction-local setting app.tenant_id (schemas/sql/018_rls.sql);
a transaction that sets none sees no such row.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection


async def act_for(conn: AsyncConnection[Any], tenant_id: str) -> None:
    """Scope the open transaction to `tenant_id`; the setting ends with the transaction,
    so a pooled connection never carries one tenant's scope into the next."""
    await conn.execute("SELECT set_config('app.tenant_id', %s, true)", (tenant_id,))
