"""How the gateway's head registry follows from a head's events: one function, live and in a rebuild.

`heads` is opened by the head's `head.requested` (:func:`open_head`), which POST heads/train
publishes; then every event of the head is appended to `head_events` and folded into the
head (`heads_logic.fold`). A `head.transitioned` moves the state; one to production writes
its `speculative_head_approvals` row, one to deprecated deletes the tenant's cached
winners that draft with the head, in the same transaction (:func:`apply`).

Live, a service's verdict (`head.gated`, `head.failed`) on a training head leads to a
`head.transitioned` the gateway publishes through the outbox in the transaction that
records the verdict (:func:`project`, the heads projector's fold); in a rebuild that
transition is on the stream already, so :func:`rebuild` only applies.

Callers hold a tenant transaction of the event's tenant (`specplatform.db.tenant_transaction`).
"""

from __future__ import annotations

import logging
from typing import Any

from specbus import outbox
from specbus.envelope import Envelope
from specops_schemas.heads import HeadEvent, HeadRequested, HeadTransitioned
from specops_services.gateway import results
from specops_services.gateway.heads import db as heads_db
from specops_services.gateway.heads import logic as heads_logic
from specplatform.db import Connection

log = logging.getLogger(__name__)


async def open_head(conn: Connection, event: Envelope[Any]) -> heads_db.HeadRow | None:
    """Insert the head a head.requested opens; None for any other event, or when it exists."""
    if not isinstance(event.payload, HeadRequested):
        return None
    return await heads_db.insert_head(conn, tenant_id=event.tenant_id, head=heads_logic.open_head(event))


async def apply(conn: Connection, event: Envelope[Any]) -> heads_db.HeadRow | None:
    """Record one event of a head and fold it in; the head now, or None when nothing changed.

    It never opens a head, so an event naming a head POST did not create changes nothing."""
    payload = event.payload
    if not isinstance(payload, HeadEvent):
        return None
    head_id = payload.head_id
    row = await heads_db.get_head(conn, event.tenant_id, head_id, for_update=True)
    if row is None:
        log.debug("%s %s names no head of tenant %s; skipped", event.type, head_id, event.tenant_id)
        return None
    if await heads_db.EVENTS.append(conn, head_id, event) is None:
        return None
    head = heads_logic.fold(row.head, event)
    if head == row.head:
        return row
    await heads_db.update_head(conn, head)
    if isinstance(payload, HeadTransitioned) and head.state != row.head.state:
        move = payload.transition
        if heads_logic.writes_approval(move):
            await heads_db.insert_approval(
                conn, tenant_id=event.tenant_id, head_id=head_id, event_id=event.event_id, move=move
            )
        if heads_logic.forgets_winners(move):
            forgotten = await heads_db.forget_winners(conn, event.tenant_id, head_id)
            if forgotten:
                log.info("deprecated head %s: %d cached winners forgotten", head_id, forgotten)
    return await heads_db.get_head(conn, event.tenant_id, head_id)


async def publish(conn: Connection, event: Envelope[Any]) -> heads_db.HeadRow | None:
    """Apply an event the gateway publishes itself, queue it in the outbox and its tenant copy."""
    row = await apply(conn, event)
    if row is not None:
        await outbox.add(conn, event)
    return row


async def project(conn: Connection, event: Envelope[Any]) -> heads_db.HeadRow | None:
    """The heads projector's fold: apply a service's event, then publish the move it leads to."""
    row = await apply(conn, event)
    if row is None:
        return None
    move = heads_logic.service_transition(row.head, event)
    if move is None:
        return row
    transition = event.follow(move, producer=results.PRODUCER).model_copy(
        update={"event_id": heads_logic.derived_event_id(event)}
    )
    after = await publish(conn, transition)
    if after is not None:
        await results.repeat(conn, transition)
    return after or row


async def rebuild(conn: Connection, event: Envelope[Any]) -> None:
    """What the gateway wrote for a head event when it happened: the head it opens, its fold."""
    await open_head(conn, event)
    await apply(conn, event)
