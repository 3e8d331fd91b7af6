"""The gateway's SQL of the T3 head registry (schemas/sql/015_heads.sql): `head_data`, `heads`,
`head_events` and `speculative_head_approvals`, which it alone writes, and the winner-cache
rows a deprecated head leaves. As in the tune sessions' db.py: functions take an open connection and run
inside the caller's transaction, tenant-facing ones inside a tenant_transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from speccatalog import artifacts
from specops_schemas.heads import HeadDataResponse, HeadResponse, HeadTransition
from specops_services.gateway.db import EventStream
from specplatform.db import Connection


@dataclass(frozen=True, slots=True)
class HeadRow:
    head_id: str
    tenant_id: str
    head: HeadResponse
    created_at: datetime
    updated_at: datetime


_COLUMNS = "id, tenant_id, head, created_at, updated_at"


def _row(row: dict[str, Any]) -> HeadRow:
    head = HeadResponse.model_validate(
        row["head"] | {"created_at": row["created_at"], "updated_at": row["updated_at"]}
    )
    return HeadRow(row["id"], row["tenant_id"], head, row["created_at"], row["updated_at"])


def _head_json(head: HeadResponse) -> Jsonb:
    return Jsonb(head.model_dump(mode="json", exclude={"created_at", "updated_at"}))


# --- head_data ----------------------------------------------------------------------------------


async def insert_data(
    conn: Connection, *, tenant_id: str, sha256: str, size_bytes: int, examples: int, path: str
) -> bool:
    """Record an upload; False if the tenant uploaded these bytes before."""
    cur = await conn.execute(
        """INSERT INTO head_data (tenant_id, sha256, size_bytes, examples, path) VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (tenant_id, sha256) DO NOTHING RETURNING sha256""",
        (tenant_id, sha256, size_bytes, examples, path),
    )
    return await cur.fetchone() is not None


async def find_data(conn: Connection, tenant_id: str, sha256: str) -> HeadDataResponse | None:
    cur = await conn.execute(
        "SELECT sha256, size_bytes, examples, created_at FROM head_data WHERE tenant_id = %s AND sha256 = %s",
        (tenant_id, sha256),
    )
    row = await cur.fetchone()
    return None if row is None else HeadDataResponse.model_validate(dict(row))


# --- heads ---------------------------------------------------------------------------------------


async def insert_head(conn: Connection, *, tenant_id: str, head: HeadResponse) -> HeadRow | None:
    """Insert a head; None when one with this id exists already (then nothing changed)."""
    cur = await conn.execute(
        f"""INSERT INTO heads (id, tenant_id, state, target, family, head, created_at, updated_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING {_COLUMNS}""",
        (
            head.id,
            tenant_id,
            head.state,
            head.target,
            head.family,
            _head_json(head),
            head.created_at,
            head.updated_at,
        ),
    )
    row = await cur.fetchone()
    return None if row is None else _row(row)


async def get_head(
    conn: Connection, tenant_id: str, head_id: str, *, for_update: bool = False
) -> HeadRow | None:
    """The tenant's head, or None (another tenant's is indistinguishable from a missing one)."""
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM heads WHERE id = %s AND tenant_id = %s{lock}", (head_id, tenant_id)
    )
    row = await cur.fetchone()
    return None if row is None else _row(row)


async def list_heads(conn: Connection, tenant_id: str) -> list[HeadRow]:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM heads WHERE tenant_id = %s ORDER BY created_at DESC, id", (tenant_id,)
    )
    return [_row(r) for r in await cur.fetchall()]


async def update_head(conn: Connection, head: HeadResponse) -> None:
    await conn.execute(
        "UPDATE heads SET state = %s, head = %s WHERE id = %s", (head.state, _head_json(head), head.id)
    )


async def artifact_paths(
    conn: Connection, tenant_id: str, drafts: list[str | None], root: Path
) -> dict[str, str]:
    """Where the tenant's trained heads among `drafts` are (their directories in the artifact
    store, `root`), by head id: what `apply` tells speccore to load for a head candidate."""
    ids = [d for d in drafts if d is not None and artifacts.is_head_id(d)]
    out: dict[str, str] = {}
    for head_id in ids:
        row = await get_head(conn, tenant_id, head_id)
        if row is not None and row.head.artifact is not None:
            out[head_id] = str(root / row.head.artifact.path)
    return out


async def head_state(conn: Connection, head_id: str) -> str | None:
    cur = await conn.execute("SELECT state FROM heads WHERE id = %s", (head_id,))
    row = await cur.fetchone()
    return None if row is None else str(row["state"])


# --- head_events (the SSE stream) -----------------------------------------------------------------


# --- approvals and the winner cache ----------------------------------------------------------------


async def insert_approval(
    conn: Connection, *, tenant_id: str, head_id: str, event_id: str, move: HeadTransition
) -> None:
    await conn.execute(
        """INSERT INTO speculative_head_approvals
               (head_id, tenant_id, event_id, from_state, to_state, actor, role, rationale, approved_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING""",
        (
            head_id,
            tenant_id,
            event_id,
            move.from_state,
            move.to_state,
            move.actor,
            move.role,
            move.rationale or "",
            move.at,
        ),
    )


async def approvals(conn: Connection, tenant_id: str, head_id: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        """SELECT from_state, to_state, actor, role, rationale, approved_at FROM speculative_head_approvals
           WHERE tenant_id = %s AND head_id = %s ORDER BY id""",
        (tenant_id, head_id),
    )
    return [dict(r) for r in await cur.fetchall()]


async def forget_winners(conn: Connection, tenant_id: str, head_id: str) -> int:
    """Delete the tenant's cached answers that list `head_id` (as the winner or any candidate:
    an answer offering a deprecated head is stale either way); how many."""
    cur = await conn.execute(
        """DELETE FROM winner_cache WHERE cache_scope = %s
           AND (winner -> 'candidate' ->> 'draft' = %s OR candidates @> %s)""",
        (tenant_id, head_id, Jsonb([{"candidate": {"draft": head_id}}])),
    )
    return cur.rowcount


# What GET .../events streams, and what the projection appends to.
EVENTS = EventStream("head_events", "head_id")
