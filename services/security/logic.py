"""The security service's decisions, without I/O: a tenant's next policy, the calendar month a
measurement counts in, and when a GPU budget is exhausted.

- `security.policy_requested` (the gateway, for an admin's PUT) -> `security.policy_changed`
  carrying the whole new policy (version + 1), its id derived from the request's, so a
  redelivered request queues the same event.
- `bench.rep_measured` (T1 benches and T2 trials alike) -> its seconds added to the
  tenant's month; `head.epoch_completed` and `head.trained` (T3) -> the head's training
  seconds so far, of which only what was not counted yet is added (so a head that fails
  after some epochs has its epochs counted, and a resumed head's repeated epoch nothing);
  `security.budget_exhausted` once per month and budget, when the count reaches the
  tenant's `gpu_budget_s` (or a new policy lowers it below the count); its id derived from
  the policy version too, so a budget set again to an earlier value is announced again.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any, TypeVar

from specbus.envelope import Envelope
from specops_schemas.heads import HeadEpochCompleted, HeadTrained
from specops_schemas.security import (
    BudgetExhausted,
    PolicyChanged,
    PolicyChangeRequested,
    PolicySettings,
    SecurityPolicy,
    budget_resets_at,
)

PRODUCER = "security"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (PolicyChanged, BudgetExhausted)
# uuid5 namespace of the ids this service derives (any fixed UUID would do).
ID_NAMESPACE = uuid.UUID("c41f7e0a-92d3-4b6e-8f15-3a7d0e9b2c64")

P = TypeVar("P", PolicyChanged, BudgetExhausted)


def next_policy(
    current: SecurityPolicy, settings: PolicySettings, *, updated_by: str, at: datetime
) -> SecurityPolicy:
    """`settings` as the tenant's policy, one version after `current`."""
    return SecurityPolicy(
        **settings.model_dump(),
        tenant_id=current.tenant_id,
        version=current.version + 1,
        updated_at=at,
        updated_by=updated_by,
    )


def policy_changed(
    request: Envelope[PolicyChangeRequested], current: SecurityPolicy
) -> Envelope[PolicyChanged]:
    """The `security.policy_changed` a request leads to (its id derived from the request's)."""
    asked = request.payload
    policy = next_policy(current, asked.settings, updated_by=asked.requested_by, at=request.occurred_at)
    changed = PolicyChanged(
        tenant_id=asked.tenant_id,
        policy=policy,
        previous_tier=current.tier,
        requested_event_id=uuid.UUID(request.event_id),
    )
    return _derived(request, changed, f"policy/{request.event_id}")


# --- the GPU budget -----------------------------------------------------------------------


def head_seconds(event: Envelope[HeadEpochCompleted] | Envelope[HeadTrained]) -> float:
    """The training seconds a head has used so far, as its latest event reports them."""
    payload = event.payload
    if isinstance(payload, HeadEpochCompleted):
        return payload.epoch.elapsed_s
    return payload.train_seconds


def is_exhausted(budget_s: float | None, used_s: float) -> bool:
    """Whether `used_s` measurement seconds have reached the monthly budget (None: unlimited)."""
    return budget_s is not None and used_s >= budget_s


def exhaustion(
    trigger: Envelope[Any],
    *,
    policy: SecurityPolicy,
    used_s: float,
    month: date,
    announced_budget_s: float | None,
) -> Envelope[BudgetExhausted] | None:
    """The `security.budget_exhausted` the month's count calls for under `policy`: once per
    month and budget (an admin who raises the budget hears again when the new one is reached);
    else None. The id is derived from the policy's version as well: a budget raised and then
    set back within the month is a new announcement, not a duplicate the outbox and
    JetStream would drop."""
    budget_s = policy.gpu_budget_s
    if budget_s is None or not is_exhausted(budget_s, used_s) or announced_budget_s == budget_s:
        return None
    exhausted = BudgetExhausted(
        tenant_id=trigger.tenant_id, budget_s=budget_s, used_s=used_s, resets_at=budget_resets_at(month)
    )
    key = f"budget/{trigger.tenant_id}/{month.isoformat()}/{policy.version}/{budget_s!r}"
    return _derived(trigger, exhausted, key)


def _derived(trigger: Envelope[Any], payload: P, key: str) -> Envelope[P]:
    follow = trigger.follow(payload, producer=PRODUCER)
    return follow.model_copy(update={"event_id": str(uuid.uuid5(ID_NAMESPACE, key))})
