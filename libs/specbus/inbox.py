"""Consumer inbox: each event's side effects happen once per consumer, however often it arrives.

JetStream delivers at least once (redelivery after a crash or a lost ack) and its
dedup window is finite (a re-publish later is stored again). The inbox row is written
in the same transaction as the side effects, so the transaction that commits it is the
only one whose effects count.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from specbus import outbox, tenancy
from specbus.envelope import Envelope

log = logging.getLogger(__name__)

Work: TypeAlias = Callable[[AsyncConnection[Any]], Awaitable[Sequence[Envelope[Any]] | None]]

_CLAIM = "INSERT INTO inbox (consumer, event_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"


async def claim(conn: AsyncConnection[Any], consumer: str, event_id: str) -> bool:
    """Record `event_id` as processed by `consumer` in the open transaction; False if it already was.

    A concurrent claim of the same event (a redelivery to another replica) waits on the
    first transaction's row: it gets False if that one commits, True if it rolls back.
    """
    cursor = await conn.execute(_CLAIM, (consumer, event_id))
    return cursor.rowcount == 1


async def process_once(
    pool: AsyncConnectionPool[Any], consumer: str, event: Envelope[Any], work: Work
) -> bool:
    """Run `work(conn)` for `event` unless `consumer` already did; True if it ran.

    Claim, side effects and the events `work` returns (queued in the outbox) commit in
    one transaction; if `work` raises, all of it rolls back and the event can be retried.
    The transaction acts for the event's tenant (`tenancy.act_for`): `work` sees and
    writes that tenant's rows of the tenant-scoped tables only.
    """
    async with pool.connection() as conn, conn.transaction():
        await tenancy.act_for(conn, event.tenant_id)
        if not await claim(conn, consumer, event.event_id):
            log.info("%s already processed %s (%s); skipped", consumer, event.event_id, event.type)
            return False
        for follow in await work(conn) or ():
            await outbox.add(conn, follow)
    return True


async def process_once_queued(
    pool: AsyncConnectionPool[Any], consumer: str, event: Envelope[Any], work: Work
) -> list[str] | None:
    """`process_once`, answering the types of the events `work` queued; None if it did not run."""
    queued: list[str] = []

    async def run(conn: AsyncConnection[Any]) -> Sequence[Envelope[Any]] | None:
        events = await work(conn)
        queued[:] = [e.type for e in events or ()]
        return events

    return queued if await process_once(pool, consumer, event, run) else None


async def process_once_logged(
    pool: AsyncConnectionPool[Any],
    consumer: str,
    event: Envelope[Any],
    work: Work,
    *,
    logger: logging.Logger,
    scope: str,
    what: str | None = None,
) -> None:
    """`process_once`, plus a service's one log line per handled event: `what` it was (default
    its type), its correlation id as `scope` (`run=<id>`, `session=<id>`), its tenant, and the
    events it queued or that it was a duplicate. An event that queued nothing is logged at
    DEBUG only: a service sees many that are not its business (another service's benches)."""
    queued = await process_once_queued(pool, consumer, event, work)
    label = what or event.type
    about = f"{scope}={event.correlation_id} tenant={event.tenant_id}"
    if queued is None:
        logger.info("%s %s -> duplicate %s skipped", label, about, event.event_id)
    elif queued:
        logger.info("%s %s -> %s", label, about, ", ".join(queued))
    else:
        logger.debug("%s %s -> nothing queued", label, about)
