"""SQL the resources share: their numbered event streams (`run_events`, `tune_session_events`,
`head_events`), keyset pages, and the winner cache (003_gateway.sql) that runs and tune sessions
fill and heads clear."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from specbus.envelope import Envelope
from specops_schemas.events import RunCompleted
from specops_services.gateway.winner_cache import CACHE_TTL, KEY_COLUMNS
from specplatform.db import Connection


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


@dataclass(frozen=True, slots=True)
class EventRow:
    seq: int
    type: str
    data: str  # the envelope as JSON text, sent verbatim as the SSE data


@dataclass(frozen=True, slots=True)
class EventStream:
    """A resource's events, numbered per owner (a run, a session, a head): the table, of columns
    (`owner`, seq, event_id, type, payload, occurred_at), that its GET .../events streams."""

    table: str
    owner: str
    """The column of the owner's id, e.g. `run_id`."""

    async def append(self, conn: Connection, owner_id: str, envelope: Envelope[Any]) -> int | None:
        """Append an event to the owner's stream; its seq, or None if this event_id is there already.

        Callers hold the owner's row lock (its get_…(..., for_update=True)), so max(seq) + 1 is
        not raced and seq order is commit order.
        """
        query = sql.SQL(
            """INSERT INTO {t} ({o}, seq, event_id, type, payload, occurred_at)
               SELECT %s, coalesce(max(seq), 0) + 1, %s, %s, %s, %s FROM {t} WHERE {o} = %s
               ON CONFLICT (event_id) DO NOTHING
               RETURNING seq"""
        ).format(t=sql.Identifier(self.table), o=sql.Identifier(self.owner))
        payload = Jsonb(envelope.model_dump(mode="json"))
        cur = await conn.execute(
            query, (owner_id, envelope.event_id, envelope.type, payload, envelope.occurred_at, owner_id)
        )
        row = await cur.fetchone()
        return None if row is None else int(row["seq"])

    async def after(
        self, conn: Connection, owner_id: str, after_seq: int, *, limit: int = 100
    ) -> list[EventRow]:
        """The owner's events after seq `after_seq`, in order, at most `limit`."""
        query = sql.SQL(
            """SELECT seq, type, payload::text AS data FROM {t}
               WHERE {o} = %s AND seq > %s ORDER BY seq LIMIT %s"""
        ).format(t=sql.Identifier(self.table), o=sql.Identifier(self.owner))
        cur = await conn.execute(query, (owner_id, after_seq, limit))
        return [EventRow(int(r["seq"]), r["type"], r["data"]) for r in await cur.fetchall()]


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
