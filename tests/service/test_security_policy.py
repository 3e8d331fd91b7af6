"""Issue 20's security policy on a real nats-server and PostgreSQL: the gateway (its admin API
and its read model), the security service, the predictor and the audit recorder in this
process. What the benchmark-runner would report (a measured rep's seconds) the test
publishes as it would."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from fixtures import bus
from fixtures.gateway import RUNS, Gateway, run_body, running_gateway
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker
from specbus.envelope import new_event
from specops_schemas.api import API_PREFIX, RunCreateRequest
from specops_schemas.events import BenchRepMeasured, RepMetrics, RunRequested
from specops_schemas.heads import HeadEpoch, HeadEpochCompleted, HeadFailed
from specops_schemas.security import OPT_OUT_REASON, SECURITY_ADR
from specops_services.audit.app import subscribe as subscribe_audit
from specops_services.predictor.app import subscribe as subscribe_predictor
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specops_services.security.app import subscribe as subscribe_security
from specplatform.db import Pool

POLICY = f"{API_PREFIX}/security/policy"
TENANT = "acme"  # the tenant of fixtures.gateway's tokens dev, viewer and admin
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
ISOLATED_OPT_OUT = {"tier": "multi_tenant_isolated", "speculation_opt_out": True}


def _security(broker: SpecBroker, pool: Pool, service: str) -> None:
    subscribe_security(broker, pool, service=service, retry=FAST, fetch_timeout_s=0.5)


def _audit(broker: SpecBroker, pool: Pool, service: str) -> None:
    subscribe_audit(broker, pool, service=service, fetch_timeout_s=0.5)


def _predictor(broker: SpecBroker, pool: Pool, service: str) -> None:
    planner = Planner(host=HostInfo(cuda=False))
    subscribe_predictor(broker, pool, planner, service=service, retry=FAST, fetch_timeout_s=0.5)


@asynccontextmanager
async def _stack(db: str, nats_url: str, *services: tuple[str, bus.Subscribe]) -> AsyncIterator[Gateway]:
    """The gateway, and each (prefix, subscribe) service on consumers of its own."""
    async with AsyncExitStack() as stack:
        for prefix, subscribe in services:
            await stack.enter_async_context(bus.serving(db, nats_url, prefix, subscribe))
        yield await stack.enter_async_context(running_gateway(db, nats_url))


def _admin_token_id(db: str) -> str:
    rows = bus.sql(db, "SELECT id FROM api_tokens WHERE tenant_id = %s AND role = 'admin'", (TENANT,))
    return str(rows[0][0])


def _audited(db: str, event_type: str) -> int:
    return len(
        bus.sql(db, "SELECT 1 FROM audit_log WHERE tenant_id = %s AND type = %s", (TENANT, event_type))
    )


async def _put(gw: Gateway, body: dict[str, Any], who: str = "admin") -> Any:
    return await gw.client.put(POLICY, json=body, headers=gw.auth(who))


def _rep(seconds: float, tenant: str = TENANT) -> Any:
    """A measured rep of `seconds` as the benchmark-runner publishes it."""
    metrics = RepMetrics(
        prompt_tokens=10,
        new_tokens=20,
        verify_steps=10,
        drafted_tokens=40,
        accepted_tokens=20,
        rollbacks=5,
        draft_time_s=0.01,
        verify_time_s=0.5,
        ttft_s=0.1,
        total_time_s=seconds,
        extra_memory_bytes=0,
        drafted_per_position=[10],
        accepted_per_position=[5],
        acceptance_rate=0.5,
        mean_acceptance_length=1.5,
        per_position_acceptance=[0.5],
        tpot_s=0.03,
        tokens_per_s=30.0,
    )
    bench_id = f"b-{uuid.uuid4().hex[:8]}"
    rep = BenchRepMeasured(bench_id=bench_id, candidate_id="baseline", rep=0, reps=1, metrics=metrics)
    return new_event(rep, tenant_id=tenant, correlation_id=bench_id, producer="benchmark-runner")


async def test_an_admin_reads_and_changes_the_policy_and_the_change_is_audited(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with _stack(db, nats_url, ("sec", _security), ("audit", _audit)) as gw:
        before = await gw.client.get(POLICY, headers=gw.auth("admin"))
        assert before.status_code == 200, before.text
        assert before.json() == {
            "tenant_id": TENANT,
            "version": 0,
            "tier": "single_tenant",
            "jitter": {"mode": "off", "interval_ms": 40.0},
            "speculation_opt_out": False,
            "gpu_budget_s": None,
            "storage_quota_bytes": 1024**3,
            "max_datastores": 100,
            "updated_at": None,
            "updated_by": None,
            "adr": SECURITY_ADR,
        }
        body = {"tier": "shared", "jitter": {"mode": "pace", "interval_ms": 30}, "gpu_budget_s": 3600}
        put = await _put(gw, body)
        assert put.status_code == 200, put.text
        changed = put.json()
        assert changed["version"] == 1 and changed["tier"] == "shared" and changed["gpu_budget_s"] == 3600
        assert changed["jitter"] == {"mode": "pace", "interval_ms": 30.0}
        assert changed["updated_by"] == _admin_token_id(db) and changed["adr"] == SECURITY_ADR
        assert (await gw.client.get(POLICY, headers=gw.auth("admin"))).json() == changed

        again = await _put(gw, ISOLATED_OPT_OUT)
        assert again.status_code == 200 and again.json()["version"] == 2

        [first, second] = await bus.events(js, f"spec.security.{TENANT}.policy_changed", at_least=2)
        assert first.payload.policy.model_dump(mode="json") == changed
        assert second.payload.previous_tier == "shared" and second.payload.policy.speculation_opt_out
        await bus.until("the changes in audit_log", lambda: _audited(db, "security.policy_changed") == 2)
        assert _audited(db, "security.policy_requested") == 2


@pytest.mark.parametrize("who", ["dev", "viewer"])
async def test_below_admin_a_change_is_refused_with_403_and_an_audited_refusal(
    db: str, nats_url: str, js: JetStreamContext, who: str
) -> None:
    async with _stack(db, nats_url, ("audit", _audit)) as gw:
        put = await _put(gw, {"tier": "shared"}, who)
        assert put.status_code == 403
        assert put.headers["content-type"] == "application/problem+json"
        assert "admin" in put.json()["detail"] and put.json()["adr"] == SECURITY_ADR
        assert (await gw.client.get(POLICY, headers=gw.auth(who))).status_code == 403

        [refused] = await bus.events(js, f"spec.security.{TENANT}.refused")
        assert refused.payload.action == "policy.update" and refused.payload.actor is not None
        assert await bus.count(js, "spec.security.*.policy_requested") == 0
        await bus.until("the refusal in audit_log", lambda: _audited(db, "security.refused") == 1)
        assert (await gw.client.get(POLICY, headers=gw.auth("admin"))).json()["version"] == 0


async def test_the_opt_out_needs_the_isolated_tier(db: str, nats_url: str) -> None:
    async with running_gateway(db, nats_url) as gw:
        put = await _put(gw, {"tier": "shared", "speculation_opt_out": True})
        assert put.status_code == 422
        assert put.headers["content-type"] == "application/problem+json"


async def test_an_opted_out_tenants_run_completes_as_speculation_disabled(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with _stack(db, nats_url, ("sec", _security), ("pred", _predictor)) as gw:
        assert (await _put(gw, ISOLATED_OPT_OUT)).status_code == 200
        # A run this host would measure (smollm on cpu) were speculation allowed, asked for at
        # once: its request carries the opt-out the gateway's read model has.
        body = run_body(model_ref="smollm2-135m-instruct", gpu="cpu", engine="speccore")
        created = await gw.create(body=body)
        assert created.status_code == 202, created.text
        run = await gw.wait_status(created.json()["id"], "completed")
        [requested] = await bus.events(js, f"spec.run.{run['id']}.requested")
        assert requested.payload.speculation_disabled is True
        assert run["speculation_disabled"] == OPT_OUT_REASON
        assert run["winner"] is None and run["candidates"] == [] and run["measured"] is False
        assert await bus.count(js, "spec.bench.>") == 0, "nothing speculative is measured"
        assert await bus.count(js, "spec.run.*.predicted") == 0
        # Nothing speculative is applied or trained for the tenant: both refused with the ADR's
        # link, and the refusals audited.
        applied = await gw.client.post(f"{RUNS}/{run['id']}/apply", headers=gw.auth("dev"))
        assert applied.status_code == 409 and applied.headers["content-type"] == "application/problem+json"
        assert applied.json()["detail"] == OPT_OUT_REASON and applied.json()["adr"] == SECURITY_ADR
        head = {"target": "smollm2-135m-instruct", "family": "medusa", "train_data": "d" * 64, "num_heads": 2}
        train = await gw.client.post(f"{API_PREFIX}/heads/train", json=head, headers=gw.auth("dev"))
        assert train.status_code == 403 and train.json()["detail"] == OPT_OUT_REASON
        assert train.json()["adr"] == SECURITY_ADR
        refused = await bus.events(js, f"spec.security.{TENANT}.refused", at_least=2)
        assert [r.payload.action for r in refused] == ["run.apply", "head.train"]

        # A request that does not carry the opt-out (an older gateway's) is answered the same
        # by the predictor's own read model of the policy.
        await bus.until(
            "the predictor's read model of the policy",
            lambda: bus.sql(db, "SELECT 1 FROM predictor_policies WHERE speculation_disabled"),
        )
        run_id = f"r-{uuid.uuid4().hex[:8]}"
        unstamped = RunRequested(
            run_id=run_id, request=RunCreateRequest.model_validate(body), requested_by="t"
        )
        await bus.publish_all(
            nats_url, [new_event(unstamped, tenant_id=TENANT, correlation_id=run_id, producer="gateway")]
        )
        [answer] = await bus.events(js, f"spec.run.{run_id}.completed")
        assert answer.payload.speculation_disabled == OPT_OUT_REASON and answer.payload.candidates == []
        assert await bus.count(js, "spec.bench.>") == 0


def _epoch(head_id: str, epoch: int, elapsed_s: float) -> Any:
    """A head's epoch as the head-trainer publishes it (a fresh event id each time: an epoch a
    resumed training reports again arrives as a new event)."""
    point = HeadEpoch(
        epoch=epoch,
        steps=4 * epoch,
        tokens_seen=512 * epoch,
        train_loss=None,
        heldout={},
        elapsed_s=elapsed_s,
    )
    done = HeadEpochCompleted(head_id=head_id, epoch=point)
    return new_event(done, tenant_id=TENANT, correlation_id=head_id, producer="head-trainer")


async def test_a_failed_heads_epochs_count_against_the_budget_once(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # Budget 1.1 s: the exhaustion's id is derived from the tenant, month, policy version and
    # budget, and the other budget test's (1.0 s) must not be a duplicate of it on the session's
    # server.
    head = "hd-" + uuid.uuid4().hex[:24]
    failed = HeadFailed(head_id=head, error_stage="benchmark", message="out of memory")
    async with _stack(db, nats_url, ("sec", _security)) as gw:
        assert (await _put(gw, {"tier": "shared", "gpu_budget_s": 1.1})).status_code == 200
        events = [_epoch(head, 0, 0.0), _epoch(head, 1, 0.6), _epoch(head, 1, 0.6), _epoch(head, 2, 0.9)]
        events.append(new_event(failed, tenant_id=TENANT, correlation_id=head, producer="head-trainer"))
        await bus.publish_all(nats_url, events)
        used = await bus.until(
            "the epochs counted", lambda: bus.sql(db, "SELECT used_s FROM security_usage WHERE used_s > 0.85")
        )
        assert used[0][0] == pytest.approx(0.9), "each second of the failed head counted once"
        assert await bus.count(js, f"spec.security.{TENANT}.budget_exhausted") == 0
        # The next head crosses the budget with its first epoch.
        await bus.publish_all(nats_url, [_epoch("hd-" + uuid.uuid4().hex[:24], 1, 0.3)])
        [exhausted] = await bus.events(js, f"spec.security.{TENANT}.budget_exhausted")
        assert (exhausted.payload.budget_s, exhausted.payload.used_s) == (1.1, pytest.approx(1.2))
        assert (await gw.create()).status_code == 429


async def test_an_over_budget_tenant_gets_429_and_no_run_starts(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with _stack(db, nats_url, ("sec", _security)) as gw:
        assert (await _put(gw, {"tier": "shared", "gpu_budget_s": 1.0})).status_code == 200
        assert (await gw.create()).status_code == 202, "within budget a run starts"
        await bus.publish_all(nats_url, [_rep(0.4), _rep(0.8)])
        [exhausted] = await bus.events(js, f"spec.security.{TENANT}.budget_exhausted")
        assert exhausted.payload.budget_s == 1.0 and exhausted.payload.used_s == pytest.approx(1.2)
        await bus.until(
            "the gateway's read model of the exhaustion",
            lambda: bus.sql(db, "SELECT 1 FROM gateway_budget_exhaustions WHERE tenant_id = %s", (TENANT,)),
        )
        runs_before = bus.sql(db, "SELECT count(*) FROM runs WHERE tenant_id = %s", (TENANT,))

        refused = await gw.create()
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["budget_s"] == 1.0 and problem["used_s"] == pytest.approx(1.2)
        assert problem["adr"] == SECURITY_ADR
        assert problem["resets_at"] == exhausted.payload.resets_at.isoformat()
        assert int(refused.headers["Retry-After"]) > 0
        assert bus.sql(db, "SELECT count(*) FROM runs WHERE tenant_id = %s", (TENANT,)) == runs_before
        [refusal] = await bus.events(js, f"spec.security.{TENANT}.refused")
        assert refusal.payload.action == "run.create"
        other = await gw.create("other")
        assert other.status_code == 202, "another tenant's budget is its own"

        # Once per month: more measured time announces nothing new.
        await bus.publish_all(nats_url, [_rep(0.5)])
        await bus.until(
            "the rep counted", lambda: bus.sql(db, "SELECT 1 FROM security_usage WHERE used_s > 1.5")
        )
        assert await bus.count(js, f"spec.security.{TENANT}.budget_exhausted") == 1

        # A raised budget lets the tenant measure again.
        assert (await _put(gw, {"tier": "shared", "gpu_budget_s": 100.0})).status_code == 200
        assert (await gw.create()).status_code == 202
