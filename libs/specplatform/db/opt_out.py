"""A service's read model of the tenants that opted out of speculation (F-S3).

Each service that must honour the opt-out (predictor, tuner) owns a table of the same
shape — `tenant_id` primary key, `version`, `speculation_disabled` — folded from the
security service's `security.policy_changed` events; these are the two queries on it.
The table is the caller's, named by it: tests/unit/test_table_ownership.py counts a call of
`record` with a table's name as that caller's write of the table.
"""

from __future__ import annotations

from psycopg import sql

from specplatform.db.pool import Connection


async def record(conn: Connection, table: str, tenant_id: str, version: int, disabled: bool) -> None:
    """Fold a tenant's policy version into ``table``; an older version changes nothing."""
    await conn.execute(
        sql.SQL(
            """INSERT INTO {t} (tenant_id, version, speculation_disabled) VALUES (%s, %s, %s)
               ON CONFLICT (tenant_id) DO UPDATE
                   SET version = EXCLUDED.version, speculation_disabled = EXCLUDED.speculation_disabled
                   WHERE {t}.version < EXCLUDED.version"""
        ).format(t=sql.Identifier(table)),
        (tenant_id, version, disabled),
    )


async def disabled(conn: Connection, table: str, tenant_id: str) -> bool:
    """Whether the tenant opted out (a tenant ``table`` has no row for has not)."""
    cur = await conn.execute(
        sql.SQL("SELECT speculation_disabled FROM {t} WHERE tenant_id = %s").format(t=sql.Identifier(table)),
        (tenant_id,),
    )
    row = await cur.fetchone()
    return row is not None and bool(row["speculation_disabled"])
