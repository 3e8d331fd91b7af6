"""The tune projector: folds the tuner's events into `tune_sessions` and `tune_session_events`
(what GET and SSE of tune-sessions read), a completed session's winner into `winner_cache`,
and repeats each recorded event to the session's tenant on NATS (`results`).

It runs inside the gateway process on the durable consumer `gateway-tune_projector`
(replicas share it), beside the runs' `gateway-projector`: a consumer of its own, so a
long tune session's events never queue behind a run's. Events of unknown sessions are
acknowledged and skipped; redeliveries are no-ops (`tune_session_events.event_id` is
unique). What an event writes is `tune_projection.apply`, the code a rebuild runs too.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy
from specops_services.gateway import projecting
from specops_services.gateway.tune import logic as tune_logic
from specops_services.gateway.tune import projection as tune_projection
from specplatform.db import Pool

CONSUMER = "tune_projector"


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the tune projector on `broker` (before the broker starts)."""
    projecting.subscribe_fold(
        broker, pool, events=tune_logic.PROJECTED, name=CONSUMER, fold=tune_projection.apply, retry=retry
    )
