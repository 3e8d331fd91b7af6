"""The projector: folds the flow's bus events into `runs` and `run_events` (what GET and SSE read),
a run's answer into `winner_cache` (what the next identical POST is answered from), and
repeats each recorded event to the run's tenant on NATS (`results`).

It runs inside the gateway process on the durable consumer `gateway-projector` (replicas
share it). An event belongs to the run its envelope's `correlation_id` names; events of
other flows (a tune session's benches) and of unknown runs are acknowledged and skipped.
Redeliveries are no-ops: `run_events.event_id` is unique and the append is what decides
whether the run row moves. What an event writes is `projection.apply`, the code a
rebuild from the stream runs too. The winner is cached in the transaction that
completes the run, so a client that sees the run completed finds its answer cached.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy
from specops_schemas.events import RUN_FLOW_TYPES, RunRequested
from specops_services.gateway.projecting import subscribe_fold
from specops_services.gateway.runs import projection
from specplatform.db import Pool

CONSUMER = "projector"
# Every event of the T1 flow but `run.requested`, which the gateway itself publishes.
PROJECTED = tuple(t for t in RUN_FLOW_TYPES if t is not RunRequested)


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the projector on `broker` (before the broker starts)."""
    subscribe_fold(broker, pool, events=PROJECTED, name=CONSUMER, fold=projection.apply, retry=retry)
