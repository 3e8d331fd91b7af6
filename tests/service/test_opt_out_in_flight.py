"""F-S3 on work already under way, on a real nats-server and PostgreSQL: once a tenant's opt-out
of speculation is folded, its run being measured completes at once as `speculation_disabled`
(predictor), its running tune session ends the same way (tuner), and what their benches report
afterwards is neither answered nor kept. The test plays the security service (its
`security.policy_changed`), the benchmark-runner and the quality gate, publishing what they would.

The fold and a step planning under the old policy race on two connections: the plan's
transaction is held open while the fold runs, so the order is the one the test makes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fixtures import bus
from fixtures.gateway import RUNS, run_body, running_gateway
from fixtures.tuner import FAST, running_tuner
from nats.js import JetStreamContext
from psycopg.types.json import Jsonb

from specbus import (
    SpecBroker,
    consumer_name,
    process_once_queued,
    publish,
)
from specbus.envelope import Envelope, new_event
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import BASELINE_ID, CandidateResult, Measurement
from specops_schemas.catalog import GateMethod
from specops_schemas.events import BenchCompleted, BenchRequested, GateEvaluated, RunRequested, parse_event
from specops_schemas.security import OPT_OUT_REASON, PolicyChanged, SecurityPolicy
from specops_schemas.tune import TuneRequested, TuneSessionCreateRequest
from specops_services.predictor import steps as predictor_steps
from specops_services.predictor.app import subscribe as subscribe_predictor
from specops_services.predictor.plan import HostInfo, plan_run
from specops_services.predictor.steps import Planner
from specops_services.tuner import db as tuner_db
from specops_services.tuner import logic as tuner_logic
from specops_services.tuner import steps as tuner_steps
from specplatform.db import Connection, Pool, create_pool, tenant_transaction

TENANT = "acme"  # the tenant of fixtures.gateway's dev token
CPU = HostInfo(cuda=False)
SMOLLM = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
TUNER = tuner_steps.Tuner(
    dsn="", bench=tuner_logic.BenchSize(reps=1, n_prompts=1, max_new_tokens=8), tick_s=0.5, grace_s=30.0
)


def _opt_out(version: int = 1) -> Envelope[PolicyChanged]:
    """The security service's event for TENANT opting out of speculation."""
    policy = SecurityPolicy(
        tenant_id=TENANT, version=version, tier="multi_tenant_isolated", speculation_opt_out=True
    )
    return new_event(
        PolicyChanged(tenant_id=TENANT, policy=policy),
        tenant_id=TENANT,
        correlation_id=TENANT,
        producer="security",
    )


def _measurement(candidate_id: str, speedup: float) -> Measurement:
    return Measurement(
        candidate_id=candidate_id,
        reps=1,
        tokens_per_s=10.0 * speedup,
        tokens_per_s_stdev=0.1,
        speedup=speedup,
        speedup_mean=None if candidate_id == BASELINE_ID else speedup,
        speedup_stdev=None if candidate_id == BASELINE_ID else 0.02,
        acceptance_rate=0.0 if candidate_id == BASELINE_ID else 0.6,
        mean_acceptance_length=1.6,
        per_position_acceptance=[0.6],
        ttft_s=0.05,
        tpot_s=0.1 / speedup,
        extra_memory_bytes=0,
    )


def _measured(bench: Envelope[BenchRequested]) -> list[Envelope[Any]]:
    """What the benchmark-runner and the quality gate publish for `bench`: every candidate 1.5x
    faster than the baseline, every verdict passed."""
    plan = bench.payload.plan
    done = bench.follow(
        BenchCompleted(
            bench_id=bench.payload.bench_id,
            plan=plan,
            baseline=_measurement(BASELINE_ID, 1.0),
            results=[_measurement(c.candidate_id, 1.5) for c in plan.candidates],
        ),
        producer="benchmark-runner",
    )
    verdicts = [
        done.follow(
            GateEvaluated(
                bench_id=bench.payload.bench_id,
                candidate_id=c.candidate_id,
                method=GateMethod.TOPK5,
                passed=True,
                score=0.99,
                threshold=0.95,
            ),
            producer="quality-gate",
        )
        for c in plan.candidates
    ]
    return [done, *verdicts]


async def _measured_and_taken(js: JetStreamContext, bench: Envelope[BenchRequested], service: str) -> None:
    """Publish what `bench` measured (`_measured`); return once `service` took all of it (acked
    the bench's completion and the last verdict)."""
    done, *verdicts = [await publish(js, e) for e in _measured(bench)]
    await bus.acked(js, consumer_name(service, "bench_completed"), done)
    await bus.acked(js, consumer_name(service, "gate_evaluated"), verdicts[-1])


async def _until_blocked(db: str, fold: asyncio.Task[Any]) -> None:
    """Until the fold waits on a lock held by the test's open transaction (or, if it never
    waits, until it is done: the assertions after say what that cost)."""
    deadline = time.monotonic() + bus.WAIT_S
    query = "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    while not fold.done() and not bus.sql(db, query):
        if time.monotonic() > deadline:
            raise TimeoutError("the fold neither waited nor finished")
        await asyncio.sleep(0.05)


Step = Callable[[Connection], Awaitable[list[Envelope[Any]]]]
Fold = Callable[[Connection, Envelope[PolicyChanged]], Awaitable[list[Envelope[Any]]]]


async def _fold_racing(db: str, pool: Pool, step: Step, fold: Fold) -> list[str] | None:
    """Fold the opt-out (`fold`, a service's policy_changed step) while `step` runs in a
    transaction held open until the fold is blocked (or done); the event types the fold queued."""
    changed = _opt_out()
    folding: asyncio.Task[list[str] | None]
    async with pool.connection() as conn, tenant_transaction(conn, TENANT):
        await step(conn)
        consumer = consumer_name(f"race_{uuid.uuid4().hex[:8]}", "policy_changed")
        folding = asyncio.create_task(
            process_once_queued(pool, consumer, changed, lambda c: fold(c, changed))
        )
        await _until_blocked(db, folding)
    return await folding


# --- predictor: a T1 run being measured --------------------------------------------------------------


def _register_predictor(broker: SpecBroker, pool: Pool, service: str) -> None:
    subscribe_predictor(broker, pool, Planner(host=CPU), service=service, retry=FAST, fetch_timeout_s=0.5)


async def test_a_run_being_measured_completes_as_speculation_disabled_when_its_tenant_opts_out(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with (
        bus.serving(db, nats_url, "pred", _register_predictor) as predictor,
        running_gateway(db, nats_url) as gw,
    ):
        created = await gw.create(body=run_body(**SMOLLM))
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        [bench] = await bus.events(js, "spec.bench.*.requested")
        await gw.wait_status(run_id, "predicted")

        await publish(js, _opt_out())
        run = await gw.wait_status(run_id, "completed")
        assert run["speculation_disabled"] == OPT_OUT_REASON
        assert run["winner"] is None and run["candidates"] == [] and run["measured"] is False

        # The bench was under way: what it reports now answers nothing and teaches nothing.
        await _measured_and_taken(js, bench, predictor)
        assert await bus.count(js, f"spec.run.{run_id}.completed") == 1
        assert (await gw.client.get(f"{RUNS}/{run_id}", headers=gw.auth())).json() == run
        applied = await gw.client.post(f"{RUNS}/{run_id}/apply", headers=gw.auth())
        assert applied.status_code == 409
    assert bus.sql(db, "SELECT count(*) FROM measured_history") == [(0,)]
    assert bus.sql(db, "SELECT count(*) FROM winner_cache") == [(0,)]


async def test_a_plan_under_way_when_the_opt_out_is_folded_is_ended_by_the_fold(db: str) -> None:
    """A plan that read the policy before the opt-out committed: the fold waits for its bench
    and ends its run. (Without the policy lock the fold finds no bench and the run is measured.)"""
    request = RunCreateRequest.model_validate({"target": SMOLLM, "workload": {"fingerprint": "code"}})
    run_id = str(uuid.uuid4())
    # The run as the gateway creates it (its row, which the candidates' row security refers to).
    bus.sql(db, "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING", (TENANT, TENANT))
    bus.sql(
        db,
        "INSERT INTO runs (id, tenant_id, request) VALUES (%s, %s, %s)",
        (run_id, TENANT, Jsonb(request.model_dump(mode="json"))),
    )
    requested = new_event(
        RunRequested(run_id=run_id, request=request, requested_by="token-1"),
        tenant_id=TENANT,
        correlation_id=run_id,
        producer="gateway",
    )
    pool = create_pool(db, max_size=3)
    await pool.open()
    try:
        await predictor_steps.received(pool, requested)

        async def plan(conn: Connection) -> list[Envelope[Any]]:
            planned = await predictor_steps.plan(conn, requested, Planner(host=CPU), None)
            assert "bench.requested" in [e.type for e in planned]
            return planned

        queued = await _fold_racing(db, pool, plan, predictor_steps.policy_changed)
    finally:
        await pool.close()
    assert queued == ["run.completed"]
    [(body,)] = bus.sql(db, "SELECT body FROM outbox WHERE subject = %s", (f"spec.run.{run_id}.completed",))
    assert parse_event(bytes(body)).payload.speculation_disabled == OPT_OUT_REASON


# --- tuner: a T2 session with a trial in flight ------------------------------------------------------


def _tune_requested() -> Envelope[TuneRequested]:
    run = RunCreateRequest.model_validate({"target": SMOLLM, "workload": {"fingerprint": "code"}})
    plan = plan_run(run, run_id="run-1", host=CPU)
    rows = [CandidateResult(candidate=r.candidate, prediction=r.prediction) for r in plan.ranked]
    session_id = str(uuid.uuid4())
    payload = TuneRequested(
        session_id=session_id,
        request=TuneSessionCreateRequest.model_validate(
            {"run_id": str(uuid.uuid4()), "budget_minutes": 5, "max_trials": 4}
        ),
        run_request=run,
        run_candidates=rows,
        run_pareto_front=plan.pareto_front[:3],
        run_winner=None,
        requested_by="token-1",
    )
    return new_event(payload, tenant_id=TENANT, correlation_id=session_id, producer="gateway")


async def _session_events(js: JetStreamContext, session_id: str) -> list[Envelope[Any]]:
    """The session's events once it completed."""
    await bus.events(js, f"spec.tune.{session_id}.completed")
    return await bus.events(js, f"spec.tune.{session_id}.*")


def _of(events: list[Envelope[Any]], kind: str) -> list[Any]:
    return [e.payload for e in events if e.type == f"tune.{kind}"]


async def test_a_running_tune_session_ends_as_speculation_disabled_when_its_tenant_opts_out(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _tune_requested()
    session_id = requested.payload.session_id
    async with running_tuner(db, nats_url, TUNER) as tuner:
        await publish(js, requested)
        [bench] = await bus.events(js, "spec.bench.*.requested")  # trial 0, not answered yet

        await publish(js, _opt_out())
        events = await _session_events(js, session_id)
        [done] = _of(events, "completed")
        assert done.speculation_disabled == OPT_OUT_REASON and done.reason == OPT_OUT_REASON
        assert done.winner is None and done.trials == 1 and done.failed_trials == 1
        [cut] = _of(events, "trial_completed")
        assert cut.result.state == "failed" and cut.result.error_message == OPT_OUT_REASON

        # Trial 0's bench was under way: what it reports now is not taken, and no trial follows.
        await _measured_and_taken(js, bench, tuner)
        assert await bus.count(js, "spec.bench.*.requested") == 1
        assert await bus.count(js, f"spec.tune.{session_id}.*") == len(events)
    assert bus.sql(db, "SELECT state FROM tuner_trials") == [("failed",)]


async def test_a_session_whose_tenant_was_found_opted_out_starts_no_further_trial(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    """The opt-out recorded without ending the session (as a tuner before this fold did): the
    session ends at its next step instead of asking the next trial."""
    requested = _tune_requested()
    session_id = requested.payload.session_id
    async with running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        [bench] = await bus.events(js, "spec.bench.*.requested")
        pool = create_pool(db, max_size=1)
        await pool.open()
        try:
            async with pool.connection() as conn, tenant_transaction(conn, TENANT):
                await tuner_db.POLICIES.fold(conn, _opt_out().payload.policy)
        finally:
            await pool.close()

        for event in _measured(bench):
            await publish(js, event)
        events = await _session_events(js, session_id)
        assert await bus.count(js, "spec.bench.*.requested") == 1
    [measured] = _of(events, "trial_completed")
    assert measured.result.state == "complete"
    [done] = _of(events, "completed")
    assert done.speculation_disabled == OPT_OUT_REASON and done.winner is None and done.trials == 1


async def test_a_session_starting_when_the_opt_out_is_folded_is_ended_by_the_fold(db: str) -> None:
    """A session started on the policy before the opt-out committed: the fold waits for it and
    ends it, its first trial cut. (Without the policy lock the fold finds no session.)"""
    requested = _tune_requested()
    tuner = dataclasses.replace(TUNER, dsn=db)
    pool = create_pool(db, max_size=3)
    await pool.open()
    try:

        async def start(conn: Connection) -> list[Envelope[Any]]:
            started = await tuner_steps.requested(conn, requested, tuner)
            assert "bench.requested" in [e.type for e in started]
            return started

        queued = await _fold_racing(
            db, pool, start, lambda conn, changed: tuner_steps.policy_changed(conn, changed, tuner)
        )
    finally:
        await pool.close()
    assert queued == ["tune.trial_completed", "tune.completed"]
    assert bus.sql(db, "SELECT stop_reason, ended_at IS NOT NULL FROM tuner_sessions") == [
        (tuner_steps.OPT_OUT, True)
    ]
