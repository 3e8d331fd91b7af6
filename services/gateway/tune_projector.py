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

from typing import Any

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy, subscriber
from specbus.envelope import Envelope
from specops_services.gateway import results, tune_logic, tune_projection
from specops_services.gateway.projector import SERVICE
from specplatform.db import Pool, tenant_transaction

CONSUMER = "tune_projector"


async def project(pool: Pool, event: Envelope[Any]) -> bool:
    """Record one event of a session and move it; False when it changed nothing."""
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        if await tune_projection.apply(conn, event) is None:
            return False
        await results.repeat(conn, event)
    return True


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the tune projector on `broker` (before the broker starts)."""

    @subscriber(
        broker, service=SERVICE, events=tune_logic.PROJECTED, name=CONSUMER, retry=retry or RetryPolicy()
    )
    async def tune_projector(event: Envelope[Any]) -> None:
        await project(pool, event)
