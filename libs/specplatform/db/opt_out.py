"""A service's read model of the tenants that opted out of speculation (F-S3).

Each service that must honour the opt-out (predictor, tuner) owns a table of the same
shape — `tenant_id` primary key, `version`, `speculation_disabled` — folded from the
security service's `security.policy_changed` events. One table each, not a shared one:
a table has one writer, and each service learns the policy from the events on its own.
`OptOuts` is such a table: its fold, its read, and the lock that orders them.

The table is the caller's, named by it (``OptOuts("predictor_policies")`` in the
predictor's db.py): tests/unit/test_table_ownership.py counts that as the caller's write.

The lock: a service that starts work under a tenant's policy (plans a run, starts a
session) reads it with ``hold=True``, which keeps it shared until the transaction ends;
`OptOuts.fold` takes it exclusively. So work started on the policy before an opt-out
committed is in place (committed) before the fold looks for the tenant's open work to
end, and work started after it reads the opt-out. An advisory lock, keyed by the table
and the tenant: a tenant with no row yet has nothing to lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from specplatform.db.pool import Connection


class Policy(Protocol):
    """A tenant's security policy, as `security.policy_changed` carries it."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def speculation_opt_out(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class OptOuts:
    """A service's table of its tenants' opt-outs."""

    table: str

    async def fold(self, conn: Connection, policy: Policy) -> bool:
        """Fold a tenant's policy, locked exclusively until the transaction ends; whether the
        tenant opts out now. The folded policy answers, not the one given: an older version,
        delivered late, changes nothing."""
        await self._lock(conn, policy.tenant_id, exclusive=True)
        await conn.execute(
            sql.SQL(
                """INSERT INTO {t} (tenant_id, version, speculation_disabled) VALUES (%s, %s, %s)
                   ON CONFLICT (tenant_id) DO UPDATE
                       SET version = EXCLUDED.version, speculation_disabled = EXCLUDED.speculation_disabled
                       WHERE {t}.version < EXCLUDED.version"""
            ).format(t=sql.Identifier(self.table)),
            (policy.tenant_id, policy.version, policy.speculation_opt_out),
        )
        return await self.disabled(conn, policy.tenant_id)

    async def disabled(self, conn: Connection, tenant_id: str, *, hold: bool = False) -> bool:
        """Whether the tenant opted out (a tenant without a row has not).

        ``hold``: keep the policy locked (shared) until the transaction ends, to start work
        under it. Never while holding a row that a fold locks after the policy (a bench, a
        session): the two transactions would wait for each other.
        """
        if hold:
            await self._lock(conn, tenant_id, exclusive=False)
        cur = await conn.execute(
            sql.SQL("SELECT speculation_disabled FROM {t} WHERE tenant_id = %s").format(
                t=sql.Identifier(self.table)
            ),
            (tenant_id,),
        )
        row = await cur.fetchone()
        return row is not None and bool(row["speculation_disabled"])

    async def _lock(self, conn: Connection, tenant_id: str, *, exclusive: bool) -> None:
        lock = sql.SQL("pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared")
        await conn.execute(
            sql.SQL("SELECT {lock}(hashtext(%s), hashtext(%s))").format(lock=lock), (self.table, tenant_id)
        )
