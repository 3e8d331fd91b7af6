"""The gateway's security decisions, without I/O: whether a POST that would measure is over
the tenant's GPU budget, and the problem types of the security refusals.

The read model (`gateway_security_policies`, `gateway_budget_exhaustions`) is folded from the
security service's `security.policy_changed` and `security.budget_exhausted`
(projection.py); the gateway never reads the security service's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from specops_schemas.api import API_PREFIX
from specops_schemas.security import BudgetExhausted, PolicyChanged, SecurityPolicy

POLICY_PATH = f"{API_PREFIX}/security/policy"
# The security events the gateway folds into its read model.
PROJECTED = (PolicyChanged, BudgetExhausted)
OVER_BUDGET = "urn:specops:problem:gpu-budget-exhausted"
POLICY_REFUSED = "urn:specops:problem:policy-change-refused"
SPECULATION_DISABLED = "urn:specops:problem:speculation-disabled"


@dataclass(frozen=True, slots=True)
class OverBudget:
    """Why a POST that would measure is refused: the month's budget is spent."""

    budget_s: float
    used_s: float
    resets_at: datetime

    def detail(self) -> str:
        return (
            f"the tenant's GPU budget of {self.budget_s:g} measurement seconds this month is used up "
            f"({self.used_s:g} s); it resets at {self.resets_at.isoformat()}"
        )

    def retry_after_s(self, now: datetime) -> int:
        """Seconds until the budget resets (at least 1), for `Retry-After`."""
        return max(1, math.ceil((self.resets_at - now).total_seconds()))


def over_budget(
    policy: SecurityPolicy, exhausted: BudgetExhausted | None, now: datetime
) -> OverBudget | None:
    """The refusal a tenant's measuring POST gets at `now`, or None while within budget.

    `exhausted` is this month's last `security.budget_exhausted`; a budget raised (or removed)
    since lets the tenant measure again until the security service announces the new one spent,
    and one whose month has ended (`resets_at` passed) refuses nothing. A tenant that opts out
    of speculation (F-S3) measures nothing, so no budget refuses it.
    """
    budget = policy.gpu_budget_s
    if policy.speculation_opt_out or budget is None or exhausted is None:
        return None
    if exhausted.used_s < budget or exhausted.resets_at <= now:
        return None
    return OverBudget(budget_s=budget, used_s=exhausted.used_s, resets_at=exhausted.resets_at)
