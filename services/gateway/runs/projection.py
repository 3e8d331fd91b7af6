"""How the gateway's tables follow from the events of a run: one function, used live and in a rebuild.

`runs` is opened by the event that carries the run's request (:func:`open_run`:
`run.queued` since its version 2, `run.requested` before), then every event of the
run's stream (`run_logic.is_recorded`) is appended to `run_events` and folded into the
run's state, and the answer of a `run.completed` that completes the run goes into
`winner_cache` (:func:`apply`). POST runs writes a new run through both, the projector
every later event through :func:`apply`; `specops audit replay --rebuild` calls
:func:`rebuild` (the same two) on the SPEC stream, so the rebuilt tables are the live
ones. Wall-clock columns that say when something happened (`winner_cache.created_at`
and its expiry) come from the event's `occurred_at`.

Callers hold a tenant transaction of the event's tenant (`specplatform.db.tenant_transaction`).
"""

from __future__ import annotations

import logging
from typing import Any

from specbus.envelope import Envelope
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import RunStatus
from specops_schemas.events import RunQueued, RunRequested
from specops_schemas.registry import DatastoreRegistered
from specops_services.gateway import datastores, db
from specops_services.gateway import winner_cache as cache
from specops_services.gateway.http import db as http_db
from specops_services.gateway.http import params
from specops_services.gateway.runs import db as run_db
from specops_services.gateway.runs import logic as run_logic
from specplatform.db import Connection

log = logging.getLogger(__name__)


def carried_request(event: Envelope[Any]) -> RunCreateRequest | None:
    """The run's request when `event` carries one (it opens the run)."""
    payload = event.payload
    if isinstance(payload, (RunRequested, RunQueued)):
        return payload.request
    return None


async def open_run(conn: Connection, event: Envelope[Any]) -> run_db.RunRow | None:
    """Insert the run `event` opens (it carries the request); None when it opens none or the run exists."""
    request = carried_request(event)
    if request is None or not params.is_spec_id(event.correlation_id):
        return None
    return await run_db.insert_run(
        conn,
        run_id=event.correlation_id,
        tenant_id=event.tenant_id,
        request=request,
        state=run_logic.RunState(RunStatus.QUEUED),
    )


async def apply(conn: Connection, event: Envelope[Any]) -> run_db.RunRow | None:
    """Record one event of a run and move the run's state; the run now, or None when nothing changed.

    The projector's only write: it never opens a run, so an event naming a run that
    POST runs did not create changes nothing.
    """
    run_id = event.correlation_id
    if not run_logic.is_recorded(event.type) or not params.is_spec_id(run_id):
        return None
    # The row lock serialises writers of this run, so seq order is commit order.
    run = await run_db.get_run(conn, event.tenant_id, run_id, for_update=True)
    if run is None:
        log.debug("%s %s names no run of tenant %s; skipped", event.type, run_id, event.tenant_id)
        return None
    if await run_db.EVENTS.append(conn, run_id, event) is None:
        return None
    state = run_logic.fold(run.state, event)
    if state == run.state:
        return run
    await run_db.update_run(conn, run_id, state)
    answer = run_logic.answer_to_cache(run.state, state, event)
    if answer is not None and cache.cacheable(run.request):
        key = cache.key_columns(run.request, tenant_id=event.tenant_id)
        await db.store_winner(conn, key, answer, source_run_id=run_id, stored_at=event.occurred_at)
    return await run_db.get_run(conn, event.tenant_id, run_id)  # as updated (updated_at included)


async def rebuild(conn: Connection, event: Envelope[Any]) -> None:
    """What the gateway wrote for `event` when it happened: its tenant, the run it opens, its fold;
    a datastore's row from its registration."""
    await http_db.ensure_tenant(conn, event.tenant_id)
    if isinstance(event.payload, DatastoreRegistered):
        await datastores.insert_datastore(conn, event)
        return
    await open_run(conn, event)
    await apply(conn, event)
