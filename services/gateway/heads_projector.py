"""The heads projector: folds the head-trainer's and the quality gate's `head.*` events into the
head registry (`heads`, `head_events`), publishes the `head.transitioned` a verdict leads to
(validated / rejected on `head.gated`, failed on `head.failed`) through the outbox in the same
transaction, and repeats each recorded event to the head's tenant on NATS (`results`).

It runs inside the gateway process on the durable consumer `gateway-heads_projector`
(replicas share it). Events of unknown heads are acknowledged and skipped; redeliveries are
no-ops (`head_events.event_id` is unique, and the transition's id derives from its cause's).
What an event writes is `heads_projection.project`; a rebuild runs `heads_projection.rebuild`.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy
from specops_services.gateway import heads_logic, heads_projection, projector
from specplatform.db import Pool

CONSUMER = "heads_projector"


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the heads projector on `broker` (before the broker starts)."""
    projector.subscribe_fold(
        broker, pool, events=heads_logic.PROJECTED, name=CONSUMER, fold=heads_projection.project, retry=retry
    )
