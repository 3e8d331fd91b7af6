"""The heads projector: folds the head-trainer's and the quality gate's `head.*` events into the
head registry (`heads`, `head_events`), publishes the `head.transitioned` a verdict leads to
(validated / rejected on `head.gated`, failed on `head.failed`) through the outbox in the same
transaction, and repeats each recorded event to the head's tenant on NATS (`results`).

It runs inside the gateway process on the durable consumer `gateway-heads_projector`
(replicas share it). Beside it, `gateway-heads_dead_letter` reads every service's dead
letters: a head whose event was parked while it trained (a trainer that keeps dying on it,
a gate that cannot finish it) is failed with a `head.failed` (error_stage dead_letter) the
gateway publishes, instead of showing `training` for ever. Events of unknown heads are
acknowledged and skipped; redeliveries are no-ops (`head_events.event_id` is unique, and the
transition's id derives from its cause's). What an event writes is `heads_projection.project`;
a rebuild runs `heads_projection.rebuild`.
"""

from __future__ import annotations

import logging

from faststream.nats import NatsBroker

from specbus import outbox
from specbus.consumer import RetryPolicy, dead_letter_subscriber
from specbus.dlq import DeadLetter
from specops_services.gateway import projecting, results
from specops_services.gateway.heads import db as heads_db
from specops_services.gateway.heads import logic as heads_logic
from specops_services.gateway.heads import projection as heads_projection
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)

CONSUMER = "heads_projector"
DEAD_LETTERS = "heads_dead_letter"


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the heads projector on `broker` (before the broker starts)."""
    projecting.subscribe_fold(
        broker, pool, events=heads_logic.PROJECTED, name=CONSUMER, fold=heads_projection.project, retry=retry
    )

    @dead_letter_subscriber(
        broker, service=projecting.SERVICE, name=DEAD_LETTERS, retry=retry or RetryPolicy()
    )
    async def head_dead_letter(letter: DeadLetter) -> None:
        """Fail a training head whose event a service parked; any other letter is not the registry's."""
        failed = heads_logic.dead_letter_failure(letter, results.PRODUCER)
        if failed is None:
            return
        async with pool.connection() as conn, tenant_transaction(conn, failed.tenant_id):
            if await heads_db.head_state(conn, failed.payload.head_id) != "training":
                return
            if await heads_projection.project(conn, failed) is not None:
                await outbox.add(conn, failed)
                log.warning("head %s failed: %s", failed.payload.head_id, failed.payload.message)
