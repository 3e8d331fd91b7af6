"""A tenant's security policy (F-S1 to F-S3) and the security events.

The security service (`specops serve security`) owns every tenant's policy: its tier, timing
jitter (F-S2), speculation opt-out (F-S3) and monthly GPU budget. Every change is a
`spec.security.<tenant>.policy_changed` event carrying the whole new policy, so the other
services keep a read model of the policies they need instead of reading the service's
table. Refusals and budget exhaustion are events too (F-S4: the audit service records
every `spec.>` event).

The tiers, weakest isolation first:

- ``single_tenant``: one tenant per deployment; caches shared.
- ``shared``: a shared GPU for several tenants; every cache per tenant (F-S1). Timing
  jitter on the acceptance path (F-S2, paced release) is available in every tier and off
  until the policy sets it.
- ``multi_tenant_isolated``: as ``shared``, and the tenant may opt out of speculation
  altogether (F-S3): nothing speculative is served or measured for them.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from uuid import UUID

from pydantic import Field, model_validator

from specbus.envelope import EventPayload
from specops_schemas.base import Id, Model

SECURITY_ADR = "docs/security-adr.md"
# Why a run or tune session of an opted-out tenant ends without speculation (F-S3).
OPT_OUT_REASON = (
    "speculation is disabled by the tenant's security policy "
    "(multi_tenant_isolated tier, speculation_opt_out; F-S3)"
)


class SecurityTier(StrEnum):
    SINGLE_TENANT = "single_tenant"
    SHARED = "shared"
    MULTI_TENANT_ISOLATED = "multi_tenant_isolated"


class JitterMode(StrEnum):
    """How streamed tokens are released (F-S2)."""

    OFF = "off"  # as soon as they are accepted: bursts follow acceptance
    PACE = "pace"  # one token per `interval_ms`, whatever was accepted when


class JitterSettings(Model):
    mode: JitterMode = Field(default=JitterMode.OFF, description="F-S2: off, or paced release.")
    interval_ms: float = Field(
        default=40.0,
        gt=0.0,
        le=1000.0,
        description="Paced release: one token per this many ms (at least the plain decoding step).",
    )


# Upper bounds, so that no policy holds a number no deployment could mean (1e30, inf): a
# month's measurement seconds of about 380 GPUs, and 1 TiB of corpora per tenant.
MAX_GPU_BUDGET_S = 1e9
MAX_STORAGE_QUOTA_BYTES = 1024**4
DEFAULT_STORAGE_QUOTA_BYTES = 1024**3
MAX_DATASTORES = 10_000
DEFAULT_MAX_DATASTORES = 100


class PolicySettings(Model):
    """What an admin sets (PUT body); the service adds the tenant, version and provenance."""

    tier: SecurityTier = Field(
        default=SecurityTier.SINGLE_TENANT, description="The tenant's tier (see module)."
    )
    jitter: JitterSettings = Field(default_factory=JitterSettings, description="F-S2 timing jitter.")
    speculation_opt_out: bool = Field(
        default=False, description="F-S3; only in the multi_tenant_isolated tier."
    )
    gpu_budget_s: float | None = Field(
        default=None,
        ge=0.0,
        le=MAX_GPU_BUDGET_S,
        description=f"Measurement seconds (T1, T2, T3) a calendar month (UTC), at most {MAX_GPU_BUDGET_S:g}; "
        "null: unlimited.",
    )
    storage_quota_bytes: int = Field(
        default=DEFAULT_STORAGE_QUOTA_BYTES,
        ge=0,
        le=MAX_STORAGE_QUOTA_BYTES,
        description="Bytes of datastores the tenant may hold (default 1 GiB, at most 1 TiB); an upload "
        "that would exceed it is refused (413).",
    )
    max_datastores: int = Field(
        default=DEFAULT_MAX_DATASTORES,
        ge=0,
        le=MAX_DATASTORES,
        description=f"Datastores the tenant may hold (default {DEFAULT_MAX_DATASTORES}, at most "
        f"{MAX_DATASTORES}); one more is refused (413).",
    )

    @model_validator(mode="after")
    def _tier_rules(self) -> PolicySettings:
        if self.speculation_opt_out and self.tier != SecurityTier.MULTI_TENANT_ISOLATED:
            raise ValueError("speculation_opt_out needs the multi_tenant_isolated tier")
        return self

    @property
    def per_tenant_caches(self) -> bool:
        """F-S1: every cache (winners, measured history, datastores, draft-side caches) per tenant."""
        return self.tier != SecurityTier.SINGLE_TENANT


class SecurityPolicy(PolicySettings):
    """A tenant's policy as the service holds it and every policy event carries it."""

    tenant_id: Id = Field(description="The tenant the policy binds.")
    version: int = Field(ge=0, description="0: the default policy, never set; +1 per change.")
    updated_at: datetime | None = Field(default=None, description="When it was last set; null if never.")
    updated_by: str | None = Field(default=None, description="Id of the admin token that set it.")
    adr: str = Field(default=SECURITY_ADR, description="What each tier guarantees (F-S5).")

    @classmethod
    def default(cls, tenant_id: str) -> SecurityPolicy:
        """The policy of a tenant that never set one: version 0, single_tenant, no budget."""
        return cls(tenant_id=tenant_id, version=0)


class SecurityEvent(EventPayload):
    """Base of the events on `spec.security.<tenant_id>.*`."""

    tenant_id: Id = Field(description="The tenant; the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.tenant_id


class PolicyChangeRequested(SecurityEvent):
    """An admin asked for a new policy (published by the gateway, applied by the security service)."""

    event_type = "security.policy_requested"
    settings: PolicySettings = Field(description="The policy asked for (the PUT body).")
    requested_by: str = Field(min_length=1, max_length=128, description="Id of the admin token that asked.")


class PolicyChanged(SecurityEvent):
    """An admin changed the tenant's policy; carries the whole new policy."""

    event_type = "security.policy_changed"
    policy: SecurityPolicy = Field(description="The whole new policy.")
    previous_tier: SecurityTier | None = Field(default=None, description="The tier before the change.")
    requested_event_id: UUID | None = Field(
        default=None, description="The `security.policy_requested` it applies (the PUT waits for it)."
    )


class SecurityRefused(SecurityEvent):
    """Something was refused for policy reasons (a non-admin policy change, speculation for
    an opted-out tenant, a run over budget)."""

    event_type = "security.refused"
    action: str = Field(min_length=1, description="What was asked, e.g. `policy.update`, `run.create`.")
    reason: str = Field(min_length=1, description="Why, as the refused caller was told.")
    actor: str | None = Field(default=None, description="Id of the token that asked, where one did.")


class BudgetExhausted(SecurityEvent):
    """The tenant's measurement time this month reached its GPU budget."""

    event_type = "security.budget_exhausted"
    budget_s: float = Field(ge=0.0, description="The monthly budget in measurement seconds.")
    used_s: float = Field(ge=0.0, description="Measurement seconds used this month.")
    resets_at: datetime = Field(description="When the month's count starts again (UTC).")

    @property
    def month(self) -> date:
        """The calendar month (its first day) whose count reached the budget: the one before
        `resets_at`, however late the event was processed."""
        return month_of(self.resets_at - timedelta(microseconds=1))


def month_of(at: datetime) -> date:
    """The first day of the calendar month (UTC) `at` falls in: what a GPU budget counts per."""
    utc = at.astimezone(UTC)
    return date(utc.year, utc.month, 1)


def budget_resets_at(month: date) -> datetime:
    """When the count of `month` (its first day) starts again: the next month's first instant, UTC."""
    year, next_month = (month.year + 1, 1) if month.month == 12 else (month.year, month.month + 1)
    return datetime(year, next_month, 1, tzinfo=UTC)


SECURITY_EVENT_TYPES: tuple[type[SecurityEvent], ...] = (
    PolicyChangeRequested,
    PolicyChanged,
    SecurityRefused,
    BudgetExhausted,
)
