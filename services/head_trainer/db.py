"""SQL of the head-trainer: only its inbox (it owns no table; its state is the work dir's checkpoint)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

_PROCESSED = "SELECT 1 FROM inbox WHERE consumer = %s AND event_id = %s"


async def processed(conn: AsyncConnection[Any], consumer: str, event_id: str) -> bool:
    """Whether `consumer` already finished this event (its inbox row is committed)."""
    cursor = await conn.execute(_PROCESSED, (consumer, event_id))
    return await cursor.fetchone() is not None
