"""The gateway's SQL of T2 tune sessions (schemas/sql/013_tune_sessions.sql): `tune_sessions` and
`tune_session_events`, which it alone writes. Kept apart from the runs' SQL
so each file stays one subject; the same rules hold: functions take an open connection
and run inside the caller's transaction, tenant-facing ones inside a tenant_transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from specops_schemas.tune import TuneSessionResponse, TuneStatus
from specops_services.gateway.db import EventStream, page_query
from specops_services.gateway.tune.logic import Source
from specplatform.db import Connection


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    tenant_id: str
    run_id: str
    session: TuneSessionResponse
    source: Source
    created_at: datetime
    updated_at: datetime


_COLUMNS = "id, tenant_id, run_id, status, session, source, created_at, updated_at"


def _row(row: dict[str, Any]) -> SessionRow:
    return SessionRow(
        session_id=row["id"],
        tenant_id=row["tenant_id"],
        run_id=row["run_id"],
        session=TuneSessionResponse.model_validate(row["session"] | {"updated_at": row["updated_at"]}),
        source=Source.from_json(row["source"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _session_json(session: TuneSessionResponse) -> Jsonb:
    # Timestamps of the row and the curve's URL are the row's and the route's, added on read.
    return Jsonb(session.model_dump(mode="json", exclude={"updated_at", "curve_png"}))


async def insert_session(
    conn: Connection, *, tenant_id: str, session: TuneSessionResponse, source: Source
) -> SessionRow | None:
    """Insert a session; None when one with this id exists already (then nothing changed)."""
    cur = await conn.execute(
        f"""INSERT INTO tune_sessions (id, tenant_id, run_id, status, session, source, created_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING {_COLUMNS}""",
        (
            session.id,
            tenant_id,
            source.run_id,
            session.status,
            _session_json(session),
            Jsonb(source.to_json()),
            session.created_at,
        ),
    )
    row = await cur.fetchone()
    return None if row is None else _row(row)


async def get_session(
    conn: Connection, tenant_id: str, session_id: str, *, for_update: bool = False
) -> SessionRow | None:
    """The tenant's session, or None (another tenant's is indistinguishable from a missing one)."""
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM tune_sessions WHERE id = %s AND tenant_id = %s{lock}",
        (session_id, tenant_id),
    )
    row = await cur.fetchone()
    return None if row is None else _row(row)


async def list_sessions(
    conn: Connection, tenant_id: str, *, limit: int, before: str | None
) -> list[SessionRow]:
    """Up to `limit` of the tenant's sessions older than session `before` (all when None), newest first."""
    cur = await conn.execute(
        page_query("tune_sessions", _COLUMNS), {"tenant": tenant_id, "before": before, "limit": limit}
    )
    return [_row(r) for r in await cur.fetchall()]


async def update_session(conn: Connection, session: TuneSessionResponse) -> None:
    await conn.execute(
        "UPDATE tune_sessions SET status = %s, session = %s WHERE id = %s",
        (session.status, _session_json(session), session.id),
    )


async def session_status(conn: Connection, session_id: str) -> TuneStatus | None:
    cur = await conn.execute("SELECT status FROM tune_sessions WHERE id = %s", (session_id,))
    row = await cur.fetchone()
    return None if row is None else row["status"]


# What GET .../events streams, and what the projection appends to.
EVENTS = EventStream("tune_session_events", "session_id")
