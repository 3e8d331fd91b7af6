"""The security projector: folds the security service's `security.policy_changed` and
`security.budget_exhausted` into the gateway's read model of the tenants' policies
(projection.py), on the durable consumer `gateway-security_projector` (replicas
share it). Redeliveries are no-ops (the newest version, the largest count wins)."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy, subscriber
from specbus.envelope import Envelope
from specops_services.gateway import projecting
from specops_services.gateway.security import logic as security_logic
from specops_services.gateway.security import projection as security_projection
from specplatform.db import Pool, tenant_transaction

CONSUMER = "security_projector"


def register(broker: NatsBroker, pool: Pool, *, retry: RetryPolicy | None = None) -> None:
    """Subscribe the security projector on `broker` (before the broker starts)."""

    @subscriber(
        broker,
        service=projecting.SERVICE,
        events=security_logic.PROJECTED,
        name=CONSUMER,
        retry=retry or RetryPolicy(),
    )
    async def security_projector(event: Envelope[Any]) -> None:
        async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
            await security_projection.project(conn, event)
