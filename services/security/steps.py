"""What each security handler does inside its inbox transaction: read (db), decide (logic),
write (db), and return the events to queue in the outbox with it.

Each step runs under `specbus.process_once`: a redelivered event changes nothing, and its
transaction acts for the event's tenant, which is all the service's tables (bound by
row-level security for their owner too) let it see.
"""

from __future__ import annotations

from typing import Any

from specbus.envelope import Envelope
from specops_schemas.events import BenchRepMeasured
from specops_schemas.heads import HeadEpochCompleted, HeadTrained
from specops_schemas.security import PolicyChangeRequested, SecurityPolicy, month_of
from specops_services.security import db, logic
from specplatform.db import Connection

Events = list[Envelope[Any]]


async def policy_requested(conn: Connection, event: Envelope[PolicyChangeRequested]) -> Events:
    """Apply an admin's policy: store it one version on and announce it (`security.policy_changed`);
    a budget lowered below this month's count is announced exhausted at once.

    The tenant's policy is locked first: replicas share the consumer, and two requests read
    at once would both become the same next version."""
    tenant = event.tenant_id
    await db.lock_policy(conn, tenant)
    current = await db.policy(conn, tenant) or SecurityPolicy.default(tenant)
    changed = logic.policy_changed(event, current)
    await db.save_policy(conn, changed.payload.policy)
    return [changed, *await _count(conn, event, 0.0)]


async def rep_measured(conn: Connection, event: Envelope[BenchRepMeasured]) -> Events:
    """Count a measured rep's device seconds against its tenant's month; announce the budget
    exhausted when this count reaches it."""
    seconds = event.payload.metrics.total_time_s
    if seconds <= 0.0:
        return []
    return await _count(conn, event, seconds)


async def head_progress(
    conn: Connection, event: Envelope[HeadEpochCompleted] | Envelope[HeadTrained]
) -> Events:
    """Count the training seconds a head used since its last counted event (each epoch, then
    the rest at `head.trained`), as `rep_measured` counts a rep."""
    new_s = await db.advance_head(conn, event.tenant_id, event.payload.head_id, logic.head_seconds(event))
    return await _count(conn, event, new_s) if new_s > 0.0 else []


async def _count(conn: Connection, trigger: Envelope[Any], seconds: float) -> Events:
    """Add `seconds` to the month of `trigger`; its `security.budget_exhausted` if due, once."""
    tenant = trigger.tenant_id
    month = month_of(trigger.occurred_at)
    used_s, announced = await db.add_usage(conn, tenant, month, seconds)
    policy = await db.policy(conn, tenant) or SecurityPolicy.default(tenant)
    exhausted = logic.exhaustion(
        trigger, policy=policy, used_s=used_s, month=month, announced_budget_s=announced
    )
    if exhausted is None:
        return []
    await db.mark_announced(conn, tenant, month, exhausted.payload.budget_s)
    return [exhausted]
