"""The live workload projector: keeps the latest `workload.summarized` per (tenant, served model)
(db.py), on the durable consumer `gateway-live_workload_projector` (replicas share it). The
summary is the event's tenant's own: it is written in that tenant's transaction, and a summary
that names another tenant than its envelope is dropped. Redeliveries and older summaries are
no-ops (the latest wins)."""

from __future__ import annotations

import logging
from typing import Any

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy, subscriber
from specbus.envelope import Envelope
from specops_schemas.serve import WorkloadSummarized
from specops_services.gateway import projecting
from specops_services.gateway.live_workload import db as live_db
from specplatform.db import Pool, tenant_transaction

log = logging.getLogger(__name__)

CONSUMER = "live_workload_projector"


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the live workload projector on `broker` (before the broker starts)."""

    @subscriber(
        broker,
        service=projecting.SERVICE,
        events=[WorkloadSummarized],
        name=CONSUMER,
        retry=retry or RetryPolicy(),
    )
    async def live_workload_projector(event: Envelope[Any]) -> None:
        summary: WorkloadSummarized = event.payload
        if summary.tenant != event.tenant_id:
            log.error(
                "dropping a workload summary of tenant %s sent as %s's", summary.tenant, event.tenant_id
            )
            return
        async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
            await live_db.save(conn, summary, event.occurred_at)
