"""Security refusals: raised inside a request, recorded as `security.refused` once the request's
transaction has rolled back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from specbus import outbox
from specbus.envelope import new_event
from specops_schemas.api import Problem
from specops_schemas.security import (
    SECURITY_ADR,
    SecurityRefused,
)
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import ProblemError
from specops_services.gateway.results import PRODUCER
from specplatform.db import Pool, tenant_transaction


class Refused(ProblemError):
    """A request refused for the tenant's security policy: its problem (with the ADR's link as
    `adr`) and the `action` it records as a `security.refused`."""

    def __init__(self, status: int, reason: str, *, type: str, action: str, **extra: Any) -> None:
        body = Problem(
            type=type,
            title=HTTPStatus(status).phrase,
            status=status,
            detail=reason,
            adr=SECURITY_ADR,
            **extra,
        )
        super().__init__(body)
        self.action = action
        self.reason = reason


@asynccontextmanager
async def recording(pool: Pool, principal: Principal) -> AsyncIterator[None]:
    """Record a `Refused` raised inside as a `security.refused`, then let it answer the request.

    Recorded on a connection of its own after the block, when the request's transaction has
    rolled back with the refusal and its connection is back in the pool: a request holding
    one connection while it waits for a second would, under a burst of refusals, leave none
    for anyone."""
    try:
        yield
    except Refused as refused:
        event = new_event(
            SecurityRefused(
                tenant_id=principal.tenant_id,
                action=refused.action,
                reason=refused.reason,
                actor=principal.token_id,
            ),
            tenant_id=principal.tenant_id,
            correlation_id=principal.tenant_id,
            producer=PRODUCER,
        )
        async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
            await outbox.add(conn, event)
        raise
