"""All of the gateway's SQL (tables of schemas/sql/001_core.sql, 003_gateway.sql and
014_datastores.sql): tenants, api_tokens, idempotency_keys, runs, run_events, winner_cache and
datastores, which it alone writes.

Functions take an open connection and run inside the caller's transaction; tenant-facing
ones expect `specplatform.db.tenant_transaction`, whose row-level security is the second wall
behind the explicit `tenant_id` filters here. The few that span tenants expect a
`specplatform.db.role_transaction` of the narrow role named in their docstring
(schemas/sql/018_rls.sql); the pool's own role sees no tenant's rows outside a tenant's
transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from specbus.envelope import Envelope
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import Role, RunStatus
from specops_schemas.events import RunCompleted
from specops_schemas.registry import DatastoreRegistered
from specops_services.gateway.cache import CACHE_TTL, KEY_COLUMNS
from specops_services.gateway.logic import RunProgress, RunState, StoredResponse
from specplatform.db import Connection, connect

# The narrow cross-tenant roles the gateway takes (schemas/sql/018_rls.sql).
TOKEN_READER = "specops_token_reader"  # live api_tokens, looked up before the tenant is known
RUN_MONITOR = "specops_run_monitor"  # every tenant's runs and run_events, read only
KEY_PURGER = "specops_key_purger"  # every tenant's expired idempotency keys, to delete

# --- tokens ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenRow:
    token_id: str
    tenant_id: str
    role: Role


async def find_token(conn: Connection, secret_sha256: str) -> TokenRow | None:
    """The live token with this hash, as TOKEN_READER (the tenant is not known yet)."""
    cur = await conn.execute(
        "SELECT id, tenant_id, role FROM api_tokens WHERE secret_sha256 = %s AND revoked_at IS NULL",
        (secret_sha256,),
    )
    row = await cur.fetchone()
    return None if row is None else TokenRow(row["id"], row["tenant_id"], Role(row["role"]))


async def token_live(conn: Connection, token_id: str) -> bool:
    """Whether the token is still there and not revoked (an open event stream re-checks its
    caller's), as TOKEN_READER."""
    cur = await conn.execute("SELECT 1 FROM api_tokens WHERE id = %s AND revoked_at IS NULL", (token_id,))
    return await cur.fetchone() is not None


async def count_runs_by_status(conn: Connection) -> dict[RunStatus, int]:
    """Every tenant's runs per status (none of a status: absent), for the runs-by-state gauge;
    as RUN_MONITOR."""
    cur = await conn.execute("SELECT status, count(*) AS n FROM runs GROUP BY status")
    return {RunStatus(row["status"]): int(row["n"]) for row in await cur.fetchall()}


async def create_token(
    conn: Connection, *, token_id: str, tenant_id: str, role: Role, secret_sha256: str, name: str | None
) -> None:
    """Insert a token, creating its tenant on first use."""
    await ensure_tenant(conn, tenant_id)
    await conn.execute(
        "INSERT INTO api_tokens (id, tenant_id, role, secret_sha256, name) VALUES (%s, %s, %s, %s, %s)",
        (token_id, tenant_id, role.value, secret_sha256, name),
    )


async def tenant_exists(conn: Connection, tenant_id: str) -> bool:
    cur = await conn.execute("SELECT 1 FROM tenants WHERE id = %s", (tenant_id,))
    return await cur.fetchone() is not None


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


async def ensure_tenant(conn: Connection, tenant_id: str) -> None:
    """Create the tenant unless it exists (named by its id)."""
    await conn.execute(
        "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING", (tenant_id, tenant_id)
    )


# --- datastores (uploaded corpora) -----------------------------------------------------------

_DATASTORE_COLUMNS = "id, name, sha256, size_bytes, format, documents, fingerprints, created_at"


async def insert_datastore(conn: Connection, event: Envelope[DatastoreRegistered]) -> bool:
    """Record a tenant's datastore from its registration event; False if it was there already."""
    ds = event.payload
    cur = await conn.execute(
        """INSERT INTO datastores
               (id, tenant_id, name, sha256, size_bytes, format, documents, fingerprints, path, created_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id""",
        (
            ds.datastore_id,
            event.tenant_id,
            ds.name,
            ds.sha256,
            ds.size_bytes,
            ds.format,
            ds.documents,
            [str(f) for f in ds.fingerprints],
            ds.path,
            event.occurred_at,
        ),
    )
    return await cur.fetchone() is not None


async def find_datastore(conn: Connection, tenant_id: str, datastore_id: str) -> dict[str, Any] | None:
    cur = await conn.execute(
        f"SELECT {_DATASTORE_COLUMNS} FROM datastores WHERE tenant_id = %s AND id = %s",
        (tenant_id, datastore_id),
    )
    row: dict[str, Any] | None = await cur.fetchone()
    return row


async def list_datastores(conn: Connection, tenant_id: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        f"SELECT {_DATASTORE_COLUMNS} FROM datastores WHERE tenant_id = %s ORDER BY created_at DESC, id",
        (tenant_id,),
    )
    return list(await cur.fetchall())


# --- idempotency keys ---------------------------------------------------------------------


def _lock_id(tenant_id: str, key: str) -> int:
    digest = hashlib.sha256(f"idempotency\0{tenant_id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def try_lock_key(conn: Connection, tenant_id: str, key: str) -> bool:
    """Hold (tenant, key) until the transaction ends; False if another request holds it.

    The lock is the in-flight marker: it is released by commit, rollback or a dropped
    connection, so a crashed request never leaves a key stuck in flight.
    """
    cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS locked", (_lock_id(tenant_id, key),))
    row = await cur.fetchone()
    return bool(row and row["locked"])


async def stored_response(conn: Connection, tenant_id: str, key: str) -> StoredResponse | None:
    cur = await conn.execute(
        """SELECT request_hash, response_status, response_body, response_headers FROM idempotency_keys
           WHERE tenant_id = %s AND key = %s AND status = 'completed' AND expires_at > now()""",
        (tenant_id, key),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return StoredResponse(
        fingerprint=row["request_hash"],
        status=row["response_status"],
        body=row["response_body"],
        headers=row["response_headers"] or {},
    )


async def store_response(
    conn: Connection, tenant_id: str, key: str, response: StoredResponse, ttl: timedelta
) -> None:
    """Keep a completed response for replay; replaces an expired row under the same key."""
    await conn.execute(
        """INSERT INTO idempotency_keys
               (tenant_id, key, request_hash, status, response_status, response_body, response_headers,
                expires_at)
           VALUES (%s, %s, %s, 'completed', %s, %s, %s, now() + %s)
           ON CONFLICT (tenant_id, key) DO UPDATE SET
               request_hash = EXCLUDED.request_hash, status = 'completed',
               response_status = EXCLUDED.response_status, response_body = EXCLUDED.response_body,
               response_headers = EXCLUDED.response_headers, created_at = now(),
               expires_at = EXCLUDED.expires_at""",
        (
            tenant_id,
            key,
            response.fingerprint,
            response.status,
            Jsonb(response.body),
            Jsonb(response.headers),
            ttl,
        ),
    )


async def purge_expired_keys(conn: Connection) -> int:
    """Delete every tenant's expired idempotency keys, as KEY_PURGER (which sees no live one)."""
    cur = await conn.execute("DELETE FROM idempotency_keys WHERE expires_at <= now()")
    return cur.rowcount


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


def page_query(table: str, columns: str) -> str:
    """A page of a tenant's rows of `table`, newest first: (tenant_id, before, before, limit).

    `before` (an id, or None for the first page) is a keyset cursor: the page starts after that
    row in (created_at, id) order; an id the tenant has not gives an empty page.
    """
    return f"""SELECT {columns} FROM {table} WHERE tenant_id = %(tenant)s
        AND (%(before)s::text IS NULL
             OR (created_at, id) < (SELECT created_at, id FROM {table}
                                    WHERE id = %(before)s AND tenant_id = %(tenant)s))
        ORDER BY created_at DESC, id DESC LIMIT %(limit)s"""


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


@dataclass(frozen=True, slots=True)
class EventRow:
    seq: int
    type: str
    data: str  # the envelope as JSON text, sent verbatim as the SSE data


async def append_event(conn: Connection, run_id: str, envelope: Envelope[Any]) -> int | None:
    """Append an event to the run's stream; its seq, or None if this event_id is already there.

    Callers hold the run's row lock (get_run(..., for_update=True)), so max(seq) + 1 is
    not raced and seq order is commit order.
    """
    cur = await conn.execute(
        """INSERT INTO run_events (run_id, seq, event_id, type, payload, occurred_at)
           SELECT %s, coalesce(max(seq), 0) + 1, %s, %s, %s, %s FROM run_events WHERE run_id = %s
           ON CONFLICT (event_id) DO NOTHING
           RETURNING seq""",
        (
            run_id,
            envelope.event_id,
            envelope.type,
            Jsonb(envelope.model_dump(mode="json")),
            envelope.occurred_at,
            run_id,
        ),
    )
    row = await cur.fetchone()
    return None if row is None else int(row["seq"])


async def events_after(conn: Connection, run_id: str, after_seq: int, *, limit: int = 100) -> list[EventRow]:
    cur = await conn.execute(
        """SELECT seq, type, payload::text AS data FROM run_events
           WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT %s""",
        (run_id, after_seq, limit),
    )
    return [EventRow(int(r["seq"]), r["type"], r["data"]) for r in await cur.fetchall()]


async def run_status(conn: Connection, run_id: str) -> RunStatus | None:
    cur = await conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,))
    row = await cur.fetchone()
    return None if row is None else RunStatus(row["status"])


# --- winner cache --------------------------------------------------------------------------


async def cached_winner(conn: Connection, key: Mapping[str, str]) -> dict[str, Any] | None:
    """The unexpired winner_cache row under `key` (cache.key_columns), or None."""
    cur = await conn.execute(
        """SELECT winner, candidates, pareto_front, measured FROM winner_cache
           WHERE cache_scope = %s AND model_ref = %s AND gpu = %s AND engine = %s AND engine_version = %s
             AND fingerprint = %s AND mode = %s AND quality_gate = %s AND expires_at > now()""",
        [key[column] for column in KEY_COLUMNS],
    )
    return await cur.fetchone()


async def store_winner(
    conn: Connection, key: Mapping[str, str], answer: RunCompleted, *, source_run_id: str, stored_at: datetime
) -> None:
    """Upsert the 30-day winner cache under `key` (cache.key_columns), as of `stored_at` (the answer's time).

    A predicted answer never replaces a live measured one.
    """
    await conn.execute(
        """INSERT INTO winner_cache (cache_scope, model_ref, gpu, engine, engine_version, fingerprint,
               mode, quality_gate, winner, candidates, pareto_front, measured, source_run_id, created_at,
               expires_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (cache_scope, model_ref, gpu, engine, engine_version, fingerprint, mode, quality_gate)
           DO UPDATE SET
               winner = EXCLUDED.winner, candidates = EXCLUDED.candidates,
               pareto_front = EXCLUDED.pareto_front, measured = EXCLUDED.measured,
               source_run_id = EXCLUDED.source_run_id, created_at = EXCLUDED.created_at,
               expires_at = EXCLUDED.expires_at
           WHERE EXCLUDED.measured OR NOT winner_cache.measured OR winner_cache.expires_at <= now()""",
        (
            *(key[column] for column in KEY_COLUMNS),
            Jsonb(answer.winner.model_dump(mode="json")) if answer.winner is not None else None,
            Jsonb([c.model_dump(mode="json") for c in answer.candidates]),
            Jsonb(list(answer.pareto_front)),
            answer.measured,
            source_run_id,
            stored_at,
            stored_at + CACHE_TTL,
        ),
    )


RUN_EVENTS_CHANNEL = "run_events"  # pg_notify channel of the trigger in 003_gateway.sql


async def listen_run_events(dsn: str) -> Connection:
    """A dedicated autocommit connection subscribed to run_events notifications."""
    conn = await connect(dsn, autocommit=True)
    await conn.execute(f"LISTEN {RUN_EVENTS_CHANNEL}")
    return conn


async def ping(conn: Connection) -> None:
    await conn.execute("SELECT 1")


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
