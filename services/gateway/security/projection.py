"""How the gateway's security read model follows from the security service's events: one
function, live (projector.py) and in a rebuild from the stream.

`security.policy_changed` -> the tenant's policy (`gateway_security_policies`, newest version
wins, with the request it applied, which a PUT waits for); `security.budget_exhausted` -> the
exhaustion of the month it counted (the one before its `resets_at`, not the one it was
processed in; `gateway_budget_exhaustions`), which refuses the tenant's measuring POSTs until
the month ends or an admin raises the budget. Callers hold a tenant transaction of the
event's tenant.
"""

from __future__ import annotations

from typing import Any

from specbus.envelope import Envelope
from specops_schemas.security import BudgetExhausted, PolicyChanged
from specops_services.gateway.security import db as security_db
from specplatform.db import Connection


async def project(conn: Connection, event: Envelope[Any]) -> bool:
    """Fold one security event into the read model; whether it changed it (other events: False)."""
    payload = event.payload
    if isinstance(payload, PolicyChanged):
        requested = None if payload.requested_event_id is None else str(payload.requested_event_id)
        return await security_db.save_policy(conn, payload.policy, requested)
    if isinstance(payload, BudgetExhausted):
        return await security_db.save_exhaustion(conn, event.tenant_id, payload, payload.month)
    return False
