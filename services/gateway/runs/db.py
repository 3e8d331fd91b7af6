"""The runs' SQL (tables of schemas/sql/001_core.sql and 003_gateway.sql): `runs` and
`run_events`, which the gateway alone writes, and the reads of the reaper and the metrics.

Functions take an open connection and run inside the caller's transaction; tenant-facing
ones expect `specplatform.db.tenant_transaction`, whose row-level security is the second wall
behind the explicit `tenant_id` filters here. The few that span tenants expect a
`specplatform.db.role_transaction` of the narrow role named in their docstring
(schemas/sql/018_rls.sql); the pool's own role sees no tenant's rows outside a tenant's
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import RunStatus
from specops_services.gateway.db import EventStream, page_query
from specops_services.gateway.runs.logic import RunProgress, RunState
from specplatform.db import Connection

RUN_MONITOR = "specops_run_monitor"  # every tenant's runs and run_events, read only

# --- tokens ------------------------------------------------------------------------------


async def count_runs_by_status(conn: Connection) -> dict[RunStatus, int]:
    """Every tenant's runs per status (none of a status: absent), for the runs-by-state gauge;
    as RUN_MONITOR."""
    cur = await conn.execute("SELECT status, count(*) AS n FROM runs GROUP BY status")
    return {RunStatus(row["status"]): int(row["n"]) for row in await cur.fetchall()}


async def active_runs(conn: Connection, tenant_id: str) -> int:
    """The tenant's runs not yet completed or failed, counted under a per-tenant lock.

    The lock (held to the end of the transaction) makes count-then-insert atomic across
    gateway replicas, so a quota is never overrun by requests racing each other.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('quota:' || %s, 0))", (tenant_id,))
    cur = await conn.execute(
        "SELECT count(*) AS n FROM runs WHERE tenant_id = %s AND status NOT IN ('completed', 'failed')",
        (tenant_id,),
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


# --- datastores (uploaded corpora) -----------------------------------------------------------


# --- idempotency keys ---------------------------------------------------------------------


# --- runs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: str
    tenant_id: str
    request: RunCreateRequest
    state: RunState
    created_at: datetime
    updated_at: datetime


_RUN_COLUMNS = "id, tenant_id, status, request, result, error, cache_hit, measured, created_at, updated_at"


def _run_row(row: dict[str, Any]) -> RunRow:
    result = row["result"] or {}
    return RunRow(
        run_id=row["id"],
        tenant_id=row["tenant_id"],
        request=RunCreateRequest.model_validate(row["request"]),
        state=RunState(
            status=RunStatus(row["status"]),
            cache_hit=row["cache_hit"],
            measured=row["measured"],
            winner=result.get("winner"),
            candidates=result.get("candidates", []),
            pareto_front=result.get("pareto_front", []),
            error=row["error"],
            speculation_disabled=result.get("speculation_disabled"),
            fit=result.get("fit"),
        ),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _result(state: RunState) -> Jsonb | None:
    if state.winner is None and not state.candidates and state.status != RunStatus.COMPLETED:
        return None
    result: dict[str, Any] = {
        "winner": state.winner,
        "candidates": state.candidates,
        "pareto_front": state.pareto_front,
    }
    if state.speculation_disabled is not None:
        result["speculation_disabled"] = state.speculation_disabled
    if state.fit is not None:
        result["fit"] = state.fit
    return Jsonb(result)


async def insert_run(
    conn: Connection, *, run_id: str, tenant_id: str, request: RunCreateRequest, state: RunState
) -> RunRow | None:
    """Insert a run; None when a run with this id exists already (then nothing changed)."""
    cur = await conn.execute(
        f"""INSERT INTO runs (id, tenant_id, status, request, result, error, cache_hit, measured)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING {_RUN_COLUMNS}""",
        (
            run_id,
            tenant_id,
            state.status.value,
            Jsonb(request.model_dump(mode="json")),
            _result(state),
            Jsonb(state.error) if state.error is not None else None,
            state.cache_hit,
            state.measured,
        ),
    )
    row = await cur.fetchone()
    return None if row is None else _run_row(row)


async def get_run(
    conn: Connection, tenant_id: str, run_id: str, *, for_update: bool = False
) -> RunRow | None:
    """The tenant's run, or None (another tenant's run is indistinguishable from a missing one)."""
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %s AND tenant_id = %s{lock}", (run_id, tenant_id)
    )
    row = await cur.fetchone()
    return None if row is None else _run_row(row)


async def list_runs(conn: Connection, tenant_id: str, *, limit: int, before: str | None) -> list[RunRow]:
    """Up to `limit` of the tenant's runs older than run `before` (all when None), newest first."""
    cur = await conn.execute(
        page_query("runs", _RUN_COLUMNS), {"tenant": tenant_id, "before": before, "limit": limit}
    )
    return [_run_row(r) for r in await cur.fetchall()]


async def update_run(conn: Connection, run_id: str, state: RunState) -> None:
    await conn.execute(
        "UPDATE runs SET status = %s, result = %s, error = %s, cache_hit = %s, measured = %s WHERE id = %s",
        (
            state.status.value,
            _result(state),
            Jsonb(state.error) if state.error is not None else None,
            state.cache_hit,
            state.measured,
            run_id,
        ),
    )


# --- run events --------------------------------------------------------------------------


async def run_status(conn: Connection, run_id: str) -> RunStatus | None:
    cur = await conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,))
    row = await cur.fetchone()
    return None if row is None else RunStatus(row["status"])


# --- winner cache --------------------------------------------------------------------------


# --- stalled runs (the reaper) ---------------------------------------------------------------

# A run not yet answered with its latest event, by when it happened (a run has its
# run.queued from the start; updated_at stands in should it have none).
_PROGRESS = """SELECT r.id, r.tenant_id, e.type, e.payload -> 'payload' ->> 'stage' AS running_stage,
                      coalesce(e.occurred_at, r.updated_at) AS last_at
               FROM runs r LEFT JOIN LATERAL (
                   SELECT type, payload, occurred_at FROM run_events
                   WHERE run_id = r.id ORDER BY occurred_at DESC, seq DESC LIMIT 1
               ) e ON true
               WHERE r.status NOT IN ('completed', 'failed')"""


def _progress(row: dict[str, Any]) -> RunProgress:
    return RunProgress(
        run_id=row["id"],
        tenant_id=row["tenant_id"],
        last_type=row["type"],
        last_running_stage=row["running_stage"],
        last_at=row["last_at"],
    )


async def unanswered_runs(conn: Connection) -> list[RunProgress]:
    """Every tenant's runs not yet completed or failed, as RUN_MONITOR."""
    cur = await conn.execute(_PROGRESS)
    return [_progress(row) for row in await cur.fetchall()]


async def lock_unanswered_run(conn: Connection, run_id: str) -> RunProgress | None:
    """The run, locked to the end of the transaction, if it is still unanswered and no other
    transaction holds it (that one is moving it, or another replica's reaper is failing it)."""
    cur = await conn.execute(f"{_PROGRESS} AND r.id = %s FOR UPDATE OF r SKIP LOCKED", (run_id,))
    row = await cur.fetchone()
    return None if row is None else _progress(row)


# What GET .../events streams, and what the projection appends to.
EVENTS = EventStream("run_events", "run_id")
