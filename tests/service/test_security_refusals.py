"""The gateway's security refusals on a real nats-server and PostgreSQL: what a tenant over its
GPU budget is still answered and what it is refused, on every measuring POST; what an
opted-out tenant is (not) refused; a PUT not applied in time (202). The security service's
events (`security.policy_changed`, `security.budget_exhausted`) are published as it would
publish them, so each test says exactly what the gateway's read model holds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures import bus
from fixtures.gateway import RUNS, Gateway, run_body, running_gateway
from nats.js import JetStreamContext

from specbus.envelope import new_event
from specops_schemas.api import API_PREFIX
from specops_schemas.base import utc_now
from specops_schemas.events import RunCompleted
from specops_schemas.security import (
    OPT_OUT_REASON,
    SECURITY_ADR,
    BudgetExhausted,
    PolicyChanged,
    SecurityPolicy,
    budget_resets_at,
    month_of,
)

TENANT = "acme"  # the tenant of fixtures.gateway's tokens dev, viewer and admin
POLICY = f"{API_PREFIX}/security/policy"
HEADS = f"{API_PREFIX}/heads"
TUNE = f"{API_PREFIX}/tune-sessions"
BUDGET = {"tier": "shared", "gpu_budget_s": 10.0}
OPTED_OUT = {"tier": "multi_tenant_isolated", "speculation_opt_out": True, "gpu_budget_s": 10.0}
HEAD_DATA = json.dumps({"prompt": "2+2=", "completion": "4"}) + "\n"


@pytest.fixture
async def gw(db: str, nats_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gateway:
        yield gateway


async def _policy(gw: Gateway, version: int, settings: dict[str, Any]) -> None:
    """The tenant's policy as the security service announces it, once the gateway has it."""
    policy = SecurityPolicy.model_validate({"tenant_id": TENANT, "version": version} | settings)
    changed = PolicyChanged(tenant_id=TENANT, policy=policy)
    await bus.publish_all(
        gw.nats_url, [new_event(changed, tenant_id=TENANT, correlation_id=TENANT, producer="security")]
    )
    query = "SELECT 1 FROM gateway_security_policies WHERE tenant_id = %s AND version = %s"
    await bus.until(
        "the policy in the gateway's read model", lambda: bus.sql(gw.dsn, query, (TENANT, version))
    )


async def _exhausted(gw: Gateway, month: date, used_s: float = 12.0) -> None:
    """`month`'s budget (10 s) announced spent, once the gateway has folded it (a test's each
    announcement has a count of its own)."""
    spent = BudgetExhausted(tenant_id=TENANT, budget_s=10.0, used_s=used_s, resets_at=budget_resets_at(month))
    await bus.publish_all(
        gw.nats_url, [new_event(spent, tenant_id=TENANT, correlation_id=TENANT, producer="security")]
    )
    query = "SELECT 1 FROM gateway_budget_exhaustions WHERE tenant_id = %s AND used_s = %s"
    await bus.until(
        "the exhaustion in the gateway's read model", lambda: bus.sql(gw.dsn, query, (TENANT, used_s))
    )


def _previous(month: date) -> date:
    return date(month.year - 1, 12, 1) if month.month == 1 else date(month.year, month.month - 1, 1)


async def _completed_run(gw: Gateway, js: JetStreamContext) -> str:
    """A T1 run of the tenant, completed and measured as the predictor would answer it."""
    run_id: str = (await gw.create()).json()["id"]
    answer = RunCompleted(
        run_id=run_id, cache_hit=False, measured=True, winner=None, candidates=[], pareto_front=[]
    )
    await bus.events(js, f"spec.run.{run_id}.queued")
    await bus.publish_all(
        gw.nats_url, [new_event(answer, tenant_id=TENANT, correlation_id=run_id, producer="predictor")]
    )
    await gw.wait_status(run_id, "completed")
    return run_id


async def _head_data(gw: Gateway) -> str:
    uploaded = await gw.client.post(
        f"{HEADS}/data", content=HEAD_DATA, headers=gw.auth(**{"Content-Type": "application/jsonl"})
    )
    assert uploaded.status_code in (200, 201), uploaded.text
    return str(uploaded.json()["sha256"])


def _train(sha: str) -> dict[str, Any]:
    return {"target": "smollm2-135m-instruct", "family": "medusa", "train_data": sha, "num_heads": 2}


def _refusal(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["adr"] == SECURITY_ADR
    return body


async def test_an_exhaustion_counts_for_the_month_it_counted_not_the_one_it_is_processed_in(
    gw: Gateway,
) -> None:
    this_month = month_of(utc_now())
    last_month = _previous(this_month)
    await _policy(gw, 1, BUDGET)
    # The security service counted last month's last reps only now: its event is processed
    # (occurred_at) this month, but it spent last month's budget.
    await _exhausted(gw, last_month, used_s=12.0)
    assert (await gw.create()).status_code == 202, "this month's budget is untouched"
    await _exhausted(gw, this_month, used_s=10.5)
    refused = _refusal(await gw.create(), 429)
    assert refused["resets_at"] == budget_resets_at(this_month).isoformat()
    # Another late one of last month (a larger count) does not replace this month's.
    await _exhausted(gw, last_month, used_s=14.0)
    again = _refusal(await gw.create(), 429)
    assert (again["used_s"], again["resets_at"]) == (10.5, budget_resets_at(this_month).isoformat())


async def test_over_budget_every_measuring_post_is_refused_and_what_measures_nothing_is_answered(
    gw: Gateway, js: JetStreamContext
) -> None:
    run_key = {"Idempotency-Key": '"run-within-budget"'}
    head_key = {"Idempotency-Key": '"head-within-budget"'}
    accepted = await gw.client.post(RUNS, json=run_body(), headers=gw.auth(**run_key))
    assert accepted.status_code == 202, accepted.text
    sha = await _head_data(gw)
    trained = await gw.client.post(f"{HEADS}/train", json=_train(sha), headers=gw.auth(**head_key))
    assert trained.status_code == 202, trained.text
    run_id = await _completed_run(gw, js)
    await _policy(gw, 1, BUDGET)
    await _exhausted(gw, month_of(utc_now()))

    run = _refusal(await gw.create(body=run_body(model_ref="smollm2-135m-instruct", gpu="cpu")), 429)
    assert (run["budget_s"], run["used_s"]) == (10.0, 12.0)
    _refusal(await gw.client.post(TUNE, json={"run_id": run_id}, headers=gw.auth()), 429)
    _refusal(await gw.client.post(f"{HEADS}/train", json=_train(sha), headers=gw.auth()), 429)
    refused = await bus.events(js, f"spec.security.{TENANT}.refused", at_least=3)
    assert sorted(r.payload.action for r in refused) == ["head.train", "run.create", "tune.create"]

    # A retry of what was accepted within budget is its stored answer, and a winner-cache hit
    # (the completed run's answer, cached) measures nothing: both are answered.
    for path, body, key, first in (
        (RUNS, run_body(), run_key, accepted),
        (f"{HEADS}/train", _train(sha), head_key, trained),
    ):
        replay = await gw.client.post(path, json=body, headers=gw.auth(**key))
        assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true", replay.text
        assert replay.json() == first.json()
    hit = await gw.create(body=run_body(gpu="h100"))
    assert hit.status_code == 200 and hit.json()["cache_hit"] is True, hit.text
    assert await bus.count(js, f"spec.security.{TENANT}.refused") == 3


async def test_an_opted_out_tenant_is_not_refused_for_a_budget_it_cannot_spend(
    gw: Gateway, js: JetStreamContext
) -> None:
    run_id = await _completed_run(gw, js)
    sha = await _head_data(gw)
    head_key = {"Idempotency-Key": '"head-before-opt-out"'}
    trained = await gw.client.post(f"{HEADS}/train", json=_train(sha), headers=gw.auth(**head_key))
    assert trained.status_code == 202, trained.text
    await _policy(gw, 1, OPTED_OUT)
    await _exhausted(gw, month_of(utc_now()))

    created = await gw.create()
    assert created.status_code == 202, created.text
    [requested] = await bus.events(js, f"spec.run.{created.json()['id']}.requested")
    assert requested.payload.speculation_disabled is True
    session = await gw.client.post(TUNE, json={"run_id": run_id}, headers=gw.auth())
    assert session.status_code == 202, session.text
    [tune] = await bus.events(js, f"spec.tune.{session.json()['id']}.requested")
    assert tune.payload.speculation_disabled is True

    # The head accepted before the opt-out is replayed to its retry; a new one is refused for the
    # opt-out, not the budget.
    replay = await gw.client.post(f"{HEADS}/train", json=_train(sha), headers=gw.auth(**head_key))
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true", replay.text
    assert (
        _refusal(await gw.client.post(f"{HEADS}/train", json=_train(sha), headers=gw.auth()), 403)["detail"]
        == OPT_OUT_REASON
    )
    # Nor is a session's winner applied (the session is the tenant's, whatever its state).
    apply = await gw.client.post(f"{TUNE}/{session.json()['id']}/apply", headers=gw.auth())
    assert _refusal(apply, 409)["detail"] == OPT_OUT_REASON
    refused = await bus.events(js, f"spec.security.{TENANT}.refused", at_least=2)
    assert [r.payload.action for r in refused] == ["head.train", "tune.apply"]


async def test_a_refusal_is_recorded_without_holding_a_second_connection(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # Two connections in the pool, one of them held here: a refused request that kept its own
    # while asking for another to record the refusal would wait out the pool's timeout (503).
    async with running_gateway(db, nats_url, gateway_pool_size=2, gateway_db_timeout_s=3.0) as gw:
        await _policy(gw, 1, BUDGET)
        await _exhausted(gw, month_of(utc_now()))
        async with gw.app.state.pool.connection():
            refused = await gw.create()
        _refusal(refused, 429)
        [event] = await bus.events(js, f"spec.security.{TENANT}.refused")
        assert event.payload.action == "run.create"


async def test_a_put_not_applied_within_the_wait_is_202_with_the_policy_in_force(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # No security service runs: the change is asked for, and not applied while the PUT waits.
    async with running_gateway(db, nats_url, gateway_policy_wait_s=0.3) as gw:
        put = await gw.client.put(POLICY, json=BUDGET, headers=gw.auth("admin"))
        assert put.status_code == 202, put.text
        assert put.headers["Location"] == POLICY
        assert put.json() == SecurityPolicy.default(TENANT).model_dump(mode="json")
        [asked] = await bus.events(js, f"spec.security.{TENANT}.policy_requested")
        assert asked.payload.settings.gpu_budget_s == 10.0
