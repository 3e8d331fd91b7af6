"""SQL the resources share: the event rows every feed returns, keyset pages, and the winner cache
(003_gateway.sql) that runs and tune sessions fill and heads clear."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

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
