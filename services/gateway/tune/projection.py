"""How the gateway's tune tables follow from a session's events: one function, live and in a rebuild.

`tune_sessions` is opened by the session's `tune.requested` (:func:`open_session`), which
POST tune-sessions publishes; then every event of the session is appended to
`tune_session_events` and folded into the session (`tune_logic.fold`), and the winner of
a `tune.completed` that completes it goes into `winner_cache` under the T1 run's request
(:func:`apply`), in the same transaction. POST writes a new session through both, the
tune projector every tuner event through :func:`apply`, and `specops audit replay
--rebuild` calls :func:`rebuild` on the SPEC stream, so the rebuilt tables are the live ones.

Callers hold a tenant transaction of the event's tenant (`specplatform.db.tenant_transaction`).
"""

from __future__ import annotations

import logging
from typing import Any

from specbus.envelope import Envelope
from specops_schemas.tune import TuneCompleted, TuneEvent, TuneRequested
from specops_services.gateway import db
from specops_services.gateway import winner_cache as cache
from specops_services.gateway.http import params
from specops_services.gateway.tune import db as tune_db
from specops_services.gateway.tune import logic as tune_logic
from specplatform.db import Connection

log = logging.getLogger(__name__)


async def open_session(conn: Connection, event: Envelope[Any]) -> tune_db.SessionRow | None:
    """Insert the session a tune.requested opens; None for any other event, or when it exists."""
    payload = event.payload
    if not isinstance(payload, TuneRequested) or not params.is_spec_id(event.correlation_id):
        return None
    return await tune_db.insert_session(
        conn,
        tenant_id=event.tenant_id,
        session=tune_logic.open_session(event),
        source=tune_logic.Source.of(payload),
    )


async def apply(conn: Connection, event: Envelope[Any]) -> tune_db.SessionRow | None:
    """Record one event of a session and fold it in; the session now, or None when nothing changed.

    It never opens a session, so an event naming a session POST did not create (another
    tenant's, or one whose database was reset) changes nothing.
    """
    session_id = event.correlation_id
    if not isinstance(event.payload, TuneEvent) or not params.is_spec_id(session_id):
        return None
    row = await tune_db.get_session(conn, event.tenant_id, session_id, for_update=True)
    if row is None:
        log.debug("%s %s names no session of tenant %s; skipped", event.type, session_id, event.tenant_id)
        return None
    if await tune_db.EVENTS.append(conn, session_id, event) is None:
        return None
    session = tune_logic.fold(row.session, event)
    if session == row.session:
        return row
    await tune_db.update_session(conn, session)
    payload = event.payload
    if isinstance(payload, TuneCompleted) and row.session.status not in tune_logic.TERMINAL_STATUSES:
        answer = tune_logic.cache_answer(row.source, payload, row.session.request.families)
        if answer is not None and cache.cacheable(row.source.request):
            key = cache.key_columns(row.source.request, tenant_id=event.tenant_id)
            await db.store_winner(conn, key, answer, source_run_id=session_id, stored_at=event.occurred_at)
    return await tune_db.get_session(conn, event.tenant_id, session_id)


async def rebuild(conn: Connection, event: Envelope[Any]) -> None:
    """What the gateway wrote for a tune event when it happened: the session it opens, its fold."""
    await open_session(conn, event)
    await apply(conn, event)
