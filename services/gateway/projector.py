"""The projector: folds the flow's bus events into `runs` and `run_events` (what GET and SSE read),
a run's answer into `winner_cache` (what the next identical POST is answered from), and
repeats each recorded event to the run's tenant on NATS (`results`).

It runs inside the gateway process on the durable consumer `gateway-projector` (replicas
share it). An event belongs to the run its envelope's `correlation_id` names; events of
other flows (a tune session's benches) and of unknown runs are acknowledged and skipped.
Redeliveries are no-ops: `run_events.event_id` is unique and the append is what decides
whether the run row moves. The winner is cached in the transaction that completes the
run, so a client that sees the run completed finds its answer cached.
"""

from __future__ import annotations

import logging
from typing import Any

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy, subscriber
from specbus.envelope import Envelope
from specops_schemas.events import EVENT_TYPES, RunRequested
from specops_services.gateway import cache, db, logic, results
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)

SERVICE = "gateway"
CONSUMER = "projector"
# Every event of the T1 flow but `run.requested`, which the gateway itself publishes.
PROJECTED = tuple(t for t in EVENT_TYPES.values() if t is not RunRequested)


async def project(pool: Pool, event: Envelope[Any]) -> bool:
    """Record one event of a run and move the run's status; False when it changed nothing."""
    run_id = event.correlation_id
    if not logic.is_recorded(event.type) or not logic.is_spec_id(run_id):
        return False
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        # The row lock serialises writers of this run, so seq order is commit order.
        run = await db.get_run(conn, event.tenant_id, run_id, for_update=True)
        if run is None:
            log.debug("%s %s names no run of tenant %s; skipped", event.type, run_id, event.tenant_id)
            return False
        if await db.append_event(conn, run_id, event) is None:
            return False
        await results.repeat(conn, event)
        state = logic.fold(run.state, event)
        if state != run.state:
            await db.update_run(conn, run_id, state)
        answer = logic.answer_to_cache(run.state, state, event)
        if answer is not None:
            key = cache.key_columns(run.request, tenant_id=event.tenant_id)
            await db.store_winner(conn, key, answer, source_run_id=run_id)
    return True


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the projector on `broker` (before the broker starts)."""

    @subscriber(broker, service=SERVICE, events=PROJECTED, name=CONSUMER, retry=retry or RetryPolicy())
    async def projector(event: Envelope[Any]) -> None:
        await project(pool, event)
