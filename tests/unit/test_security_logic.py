"""The pure security decisions: tier rules, a policy's next version, the GPU budget's calendar
month (UTC) and when it is exhausted, and the gateway's over-budget refusal."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from specbus.envelope import Envelope, new_event
from specops_schemas.heads import HeadArtifact, HeadEpoch, HeadEpochCompleted, HeadTrained, HeadTrainRequest
from specops_schemas.security import (
    BudgetExhausted,
    PolicyChangeRequested,
    PolicySettings,
    SecurityPolicy,
    SecurityTier,
    budget_resets_at,
    month_of,
)
from specops_services.gateway.security import logic as security_logic
from specops_services.security import logic

TENANT = "acme"
HEAD_ID = "hd-" + "0" * 24


def _requested(settings: PolicySettings) -> Envelope[PolicyChangeRequested]:
    asked = PolicyChangeRequested(tenant_id=TENANT, settings=settings, requested_by="tok-admin")
    return new_event(asked, tenant_id=TENANT, correlation_id=TENANT, producer="gateway")


def test_only_the_isolated_tier_may_opt_out_of_speculation() -> None:
    for tier in (SecurityTier.SINGLE_TENANT, SecurityTier.SHARED):
        with pytest.raises(ValidationError, match="multi_tenant_isolated"):
            PolicySettings(tier=tier, speculation_opt_out=True)
    isolated = PolicySettings(tier=SecurityTier.MULTI_TENANT_ISOLATED, speculation_opt_out=True)
    assert isolated.speculation_opt_out and isolated.per_tenant_caches
    assert not PolicySettings().per_tenant_caches and PolicySettings(tier="shared").per_tenant_caches


def test_a_change_is_the_next_version_with_its_provenance_and_a_derived_id() -> None:
    default = SecurityPolicy.default(TENANT)
    assert (
        default.version == 0 and default.tier == SecurityTier.SINGLE_TENANT and default.gpu_budget_s is None
    )
    request = _requested(PolicySettings(tier="shared", gpu_budget_s=60.0))
    changed = logic.policy_changed(request, default)
    policy = changed.payload.policy
    assert (policy.version, policy.tier, policy.gpu_budget_s) == (1, "shared", 60.0)
    assert policy.updated_by == "tok-admin" and policy.updated_at == request.occurred_at
    assert changed.payload.previous_tier == SecurityTier.SINGLE_TENANT
    assert str(changed.payload.requested_event_id) == request.event_id
    assert logic.policy_changed(request, default).event_id == changed.event_id, "a redelivery queues the same"
    assert logic.policy_changed(request, policy).payload.policy.version == 2


@pytest.mark.parametrize(
    ("at", "month", "resets"),
    [
        (datetime(2026, 11, 25, 23, 59, tzinfo=UTC), date(2026, 11, 1), datetime(2026, 12, 1, tzinfo=UTC)),
        (datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC), date(2026, 12, 1), datetime(2027, 1, 1, tzinfo=UTC)),
        (datetime(2028, 2, 29, 12, tzinfo=UTC), date(2028, 2, 1), datetime(2028, 3, 1, tzinfo=UTC)),
        # 1 December 01:00 in UTC+2 is still November in UTC.
        (datetime(2026, 12, 1, 1, tzinfo=timezone(timedelta(hours=2))), date(2026, 11, 1), None),
    ],
)
def test_the_budget_counts_per_calendar_month_in_utc(at: datetime, month: date, resets: Any) -> None:
    assert month_of(at) == month
    if resets is not None:
        assert budget_resets_at(month) == resets


def test_the_budget_is_announced_exhausted_once_per_month_and_budget() -> None:
    trigger = _requested(PolicySettings())
    month = date(2026, 11, 1)

    def exhausted(budget: float | None, used: float, announced: float | None, version: int = 1) -> Any:
        policy = SecurityPolicy(tenant_id=TENANT, version=version, gpu_budget_s=budget)
        return logic.exhaustion(
            trigger, policy=policy, used_s=used, month=month, announced_budget_s=announced
        )

    assert exhausted(None, 1e9, None) is None, "no budget: unlimited"
    assert exhausted(10.0, 9.99, None) is None
    first = exhausted(10.0, 10.0, None)
    assert first is not None and first.payload.resets_at == datetime(2026, 12, 1, tzinfo=UTC)
    assert (first.payload.budget_s, first.payload.used_s) == (10.0, 10.0)
    assert first.payload.month == month
    assert exhausted(10.0, 12.0, 10.0) is None, "announced already this month"
    raised = exhausted(20.0, 25.0, 10.0, version=2)
    assert raised is not None and raised.event_id != first.event_id
    # Set back to 10 s after the 20 s were spent: announced again, under an id of its own (the
    # outbox and JetStream drop an event whose id they have seen).
    lowered = exhausted(10.0, 25.0, 20.0, version=3)
    assert lowered is not None and lowered.event_id not in (first.event_id, raised.event_id)


def test_an_exhaustion_belongs_to_the_month_it_counted_however_late_it_is_processed() -> None:
    january = BudgetExhausted(
        tenant_id=TENANT, budget_s=10.0, used_s=10.0, resets_at=budget_resets_at(date(2027, 1, 1))
    )
    assert january.month == date(2027, 1, 1)
    assert month_of(january.resets_at) == date(2027, 2, 1), "the month it resets in is not its own"


def test_the_gateway_refuses_only_while_the_current_budget_is_spent() -> None:
    resets = datetime(2026, 12, 1, tzinfo=UTC)
    now = resets - timedelta(days=3)
    spent = BudgetExhausted(tenant_id=TENANT, budget_s=10.0, used_s=11.0, resets_at=resets)
    policy = SecurityPolicy(tenant_id=TENANT, version=1, gpu_budget_s=10.0)
    refusal = security_logic.over_budget(policy, spent, now)
    assert refusal is not None and (refusal.budget_s, refusal.used_s) == (10.0, 11.0)
    assert refusal.retry_after_s(resets - timedelta(seconds=90.5)) == 91
    assert refusal.retry_after_s(resets + timedelta(seconds=5)) == 1
    assert security_logic.over_budget(policy, None, now) is None
    assert security_logic.over_budget(policy.model_copy(update={"gpu_budget_s": 20.0}), spent, now) is None
    assert security_logic.over_budget(policy.model_copy(update={"gpu_budget_s": None}), spent, now) is None
    assert security_logic.over_budget(policy, spent, resets) is None, "the month has ended"
    opted_out = policy.model_copy(
        update={"tier": SecurityTier.MULTI_TENANT_ISOLATED, "speculation_opt_out": True}
    )
    assert security_logic.over_budget(opted_out, spent, now) is None, (
        "nothing of an opted-out tenant measures"
    )


def test_a_heads_seconds_are_its_training_time_so_far() -> None:
    request = HeadTrainRequest(target="smollm2-135m-instruct", family="medusa", train_data="a" * 64)
    artifact = HeadArtifact(
        sha256="b" * 64,
        path=f"heads/{TENANT}/{'b' * 64}",
        weights_sha256="c" * 64,
        target_weights="d" * 64,
        num_heads=4,
        params=1000,
    )
    trained = HeadTrained(
        head_id=HEAD_ID,
        request=request,
        heldout_path=None,
        train_path="heads-data/acme/a.jsonl",
        artifact=artifact,
        stopped_by="epochs",
        steps=10,
        tokens_seen=4096,
        train_seconds=42.5,
    )
    event = new_event(trained, tenant_id=TENANT, correlation_id=HEAD_ID, producer="head-trainer")
    assert logic.head_seconds(event) == 42.5
    point = HeadEpoch(epoch=2, steps=8, tokens_seen=2048, train_loss=1.5, heldout={}, elapsed_s=30.25)
    done = HeadEpochCompleted(head_id=HEAD_ID, epoch=point)
    epoch = new_event(done, tenant_id=TENANT, correlation_id=HEAD_ID, producer="head-trainer")
    assert logic.head_seconds(epoch) == 30.25
