"""How the gateway's projectors consume the bus: each folds its events into its resource's tables
on a durable consumer `gateway-<name>` (replicas share it), in one tenant transaction with the
repeat of the event to the tenant (`results`). The folds are the resources' own (`*/projection.py`),
the same code a rebuild from the stream runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faststream.nats import NatsBroker

from specbus.consumer import RetryPolicy, subscriber
from specbus.envelope import Envelope, EventPayload
from specops_services.gateway import results
from specplatform.db import Connection, Pool, tenant_transaction

SERVICE = "gateway"
"""The gateway's name on the bus (consumer names, dead-letter subject, inbox prefix)."""

# What one event writes: the run or session now, or None when it changed nothing.
Fold = Callable[[Connection, Envelope[Any]], Awaitable[object | None]]


async def project(pool: Pool, event: Envelope[Any], fold: Fold) -> bool:
    """Record one event with `fold` and repeat it to its tenant; False if nothing changed."""
    async with pool.connection() as conn, tenant_transaction(conn, event.tenant_id):
        if await fold(conn, event) is None:
            return False
        await results.repeat(conn, event)
    return True


def subscribe_fold(
    broker: NatsBroker,
    pool: Pool,
    *,
    events: Sequence[type[EventPayload]],
    name: str,
    fold: Fold,
    retry: RetryPolicy | None,
) -> None:
    """Project `events` with `fold` on the durable consumer `gateway-<name>`."""

    @subscriber(broker, service=SERVICE, events=events, name=name, retry=retry or RetryPolicy())
    async def projector(event: Envelope[Any]) -> None:
        await project(pool, event, fold)
