"""The tuner service on a real nats-server and PostgreSQL. The test plays the benchmark-runner
and the quality gate: it takes the tuner's `bench.requested` and answers with `bench.completed`
and `gate.evaluated` carrying scripted numbers, as those services would."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import nats
import optuna
from fixtures import bus
from fixtures.tuner import running_tuner
from nats.js import JetStreamContext

from specbus import publish
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope, new_event
from specbus.publish import publish_raw
from specbus.subjects import dlq_subject
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import BASELINE_ID, CandidateResult, Measurement
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import BenchCompleted, BenchRequested, GateEvaluated, RunFailed, parse_event
from specops_schemas.security import OPT_OUT_REASON, PolicyChanged, SecurityPolicy
from specops_schemas.tune import TuneRequested, TuneSessionCreateRequest
from specops_services.predictor.plan import HostInfo, plan_run
from specops_services.tuner import logic, steps, study
from specops_services.tuner import space as search

TENANT = "acme"
TUNER = steps.Tuner(
    dsn="", bench=logic.BenchSize(reps=3, n_prompts=1, max_new_tokens=8), tick_s=0.5, grace_s=3.0
)

# (trial number, candidate id) -> (speedup, sigma of the per-rep speedups, gate passed)
Script = Callable[[int, str], tuple[float, float, bool]]


def _requested(**body: Any) -> Envelope[TuneRequested]:
    run = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": "code"},
        }
    )
    plan = plan_run(run, run_id="run-1", host=HostInfo(cuda=False))
    rows = [CandidateResult(candidate=r.candidate, prediction=r.prediction) for r in plan.ranked]
    session_id = str(uuid.uuid4())
    payload = TuneRequested(
        session_id=session_id,
        request=TuneSessionCreateRequest.model_validate({"run_id": str(uuid.uuid4()), **body}),
        run_request=run,
        run_candidates=rows,
        run_pareto_front=plan.pareto_front[:3],
        run_winner=None,
        requested_by="token-1",
    )
    return new_event(payload, tenant_id=TENANT, correlation_id=session_id, producer="gateway")


def _measurement(cid: str, speedup: float, sigma: float | None) -> Measurement:
    return Measurement(
        candidate_id=cid,
        reps=3,
        tokens_per_s=10.0 * speedup,
        tokens_per_s_stdev=0.1,
        speedup=speedup,
        speedup_mean=None if cid == BASELINE_ID else speedup,
        speedup_stdev=sigma,
        acceptance_rate=0.5 if cid != BASELINE_ID else 0.0,
        mean_acceptance_length=1.5,
        per_position_acceptance=[0.5],
        ttft_s=0.05,
        tpot_s=0.1 / speedup,
        extra_memory_bytes=0,
    )


@dataclass
class Lab:
    """The benchmark-runner and the quality gate, played with a script."""

    nats_url: str
    script: Script
    hold: set[int] = field(default_factory=set)  # trials whose bench is not answered (yet)
    requested: list[Envelope[BenchRequested]] = field(default_factory=list)

    async def answer(self, js: JetStreamContext, request: Envelope[BenchRequested]) -> None:
        plan = request.payload.plan
        [cand] = plan.candidates
        trial = int(cand.candidate_id.split("-")[0][1:])
        speedup, sigma, passed = self.script(trial, cand.candidate_id)
        done = request.follow(
            BenchCompleted(
                bench_id=request.payload.bench_id,
                plan=plan,
                baseline=_measurement(BASELINE_ID, 1.0, None),
                results=[_measurement(cand.candidate_id, speedup, sigma)],
            ),
            producer="benchmark-runner",
        )
        verdict = done.follow(
            GateEvaluated(
                bench_id=request.payload.bench_id,
                candidate_id=cand.candidate_id,
                method=GateMethod.TOPK5,
                passed=passed,
                score=0.99 if passed else 0.42,
                threshold=0.95,
            ),
            producer="quality-gate",
        )
        await publish(js, done)
        await publish(js, verdict)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Lab]:
        nc = await nats.connect(self.nats_url)
        js = nc.jetstream()

        async def on_request(msg: Any) -> None:
            event = parse_event(msg.data)
            self.requested.append(event)
            await msg.ack()
            trial = int(event.payload.plan.candidates[0].candidate_id.split("-")[0][1:])
            if trial not in self.hold:
                await asyncio.sleep(0.05)
                await self.answer(js, event)

        sub = await js.subscribe("spec.bench.*.requested", cb=on_request, manual_ack=True)
        try:
            yield self
        finally:
            await sub.unsubscribe()
            await nc.close()


async def _session_events(
    js: JetStreamContext, session_id: str, end: str = "completed"
) -> list[Envelope[Any]]:
    """The session's events once it ended (`tune.<end>` is on the stream)."""
    await bus.events(js, f"spec.tune.{session_id}.{end}", wait_s=90.0)
    return await bus.events(js, f"spec.tune.{session_id}.*")


def _of(events: list[Envelope[Any]], kind: str) -> list[Any]:
    return [e.payload for e in events if e.type == f"tune.{kind}"]


async def test_a_short_session_completes_with_a_best_so_far_curve(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5, max_trials=4)
    session_id = requested.payload.session_id

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        return (1.1, 1.4, 1.2, 1.3)[trial], 0.02, True

    async with Lab(nats_url, script).running() as lab, running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    [started] = _of(events, "started")
    assert started.seeded >= 1 and started.space[0].name == "family"
    trials = _of(events, "trial_completed")
    assert [t.result.trial for t in trials] == [0, 1, 2, 3]
    assert all(t.result.state == "complete" for t in trials)
    assert trials[0].result.seeded
    assert [t.point.best_value for t in trials] == [1.1, 1.4, 1.4, 1.4]
    assert [i.best.trial for i in _of(events, "improved")] == [0, 1]
    [done] = _of(events, "completed")
    assert done.reason == logic.STOP_MAX_TRIALS and not done.auto_terminated
    assert done.trials == 4 and done.failed_trials == 0
    assert [p.best_value for p in done.curve] == [1.1, 1.4, 1.4, 1.4]
    assert done.winner is not None and done.winner.measurement.speedup == 1.4
    assert done.best.trial == 1 and done.best.speedup_stdev == 0.02
    assert done.baseline is not None and done.baseline.candidate_id == BASELINE_ID
    assert len({r.payload.bench_id for r in lab.requested}) == 4
    # Optuna's study holds the same trials, in the project's Postgres, schema `optuna`.
    stored = optuna.load_study(study_name=session_id, storage=study.storage(db))
    assert [t.state.name for t in stored.trials] == ["COMPLETE"] * 4
    assert bus.sql(db, "SELECT count(*) FROM optuna.trials") == [(4,)]
    in_public = """SELECT count(*) FROM information_schema.tables
                   WHERE table_schema = 'public' AND table_name = 'trials'"""
    assert bus.sql(db, in_public) == [(0,)]


async def test_a_gate_failing_candidate_is_a_failed_trial_with_its_reason(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5, max_trials=3)
    session_id = requested.payload.session_id

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        return 1.5, 0.02, trial != 1

    async with Lab(nats_url, script).running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    failed = [t.result for t in _of(events, "trial_completed") if t.result.state == "failed"]
    assert [t.trial for t in failed] == [1]
    assert failed[0].error_stage == ErrorStage.QUALITY_REGRESSION
    assert "score 0.42" in failed[0].error_message and "threshold 0.95" in failed[0].error_message
    assert failed[0].value is None and failed[0].measurement is not None
    [done] = _of(events, "completed")
    assert done.failed_trials == 1 and done.trials == 3
    stored = optuna.load_study(study_name=session_id, storage=study.storage(db))
    assert [t.state.name for t in stored.trials] == ["COMPLETE", "FAIL", "COMPLETE"]


async def test_a_plateau_is_auto_terminated(db: str, nats_url: str, js: JetStreamContext) -> None:
    requested = _requested(budget_minutes=0.25)
    session_id = requested.payload.session_id

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        return 1.2 + 0.01 * (trial % 3), 0.05, True

    async with Lab(nats_url, script).running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    [terminated] = _of(events, "terminated")
    assert terminated.top3_now - terminated.top3_start <= terminated.sigma
    assert terminated.elapsed_s >= 0.8 * 15.0
    [done] = _of(events, "completed")
    assert done.auto_terminated and done.reason == terminated.reason
    assert done.elapsed_s < 15.0 + 3.0


async def test_a_steady_climber_runs_to_its_budget(db: str, nats_url: str, js: JetStreamContext) -> None:
    requested = _requested(budget_minutes=0.25)
    session_id = requested.payload.session_id

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        return 1.0 + 0.1 * trial, 0.01, True

    async with Lab(nats_url, script).running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    assert _of(events, "terminated") == []
    [done] = _of(events, "completed")
    assert not done.auto_terminated and done.reason == logic.STOP_BUDGET
    assert done.elapsed_s >= 15.0
    values = [p.best_value for p in done.curve]
    assert values == sorted(values) and len(values) >= 5


async def test_a_restarted_tuner_resumes_without_losing_or_doubling_a_trial(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5, max_trials=5)
    session_id = requested.payload.session_id
    service = f"tuner_{uuid.uuid4().hex[:8]}"

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        return 1.1 + 0.05 * trial, 0.02, True

    lab = Lab(nats_url, script, hold={2})
    async with lab.running():
        async with running_tuner(db, nats_url, TUNER, service):
            await publish(js, requested)
            # Trial 2's bench is requested; the tuner stops while it is being measured.
            await bus.events(js, f"spec.tune.{session_id}.trial_completed", at_least=2)
            while len(lab.requested) < 3:
                await asyncio.sleep(0.05)
        # Measured while no tuner runs: its answer waits on the stream.
        await lab.answer(js, lab.requested[2])
        await asyncio.sleep(2.0)
        async with running_tuner(db, nats_url, TUNER, service):
            events = await _session_events(js, session_id)

    trials = [t.result for t in _of(events, "trial_completed")]
    assert [t.trial for t in trials] == [0, 1, 2, 3, 4]
    assert all(t.state == "complete" for t in trials)
    bench_ids = [r.payload.bench_id for r in lab.requested]
    assert len(bench_ids) == 5 and len(set(bench_ids)) == 5
    assert bench_ids == [logic.bench_id_for(session_id, n) for n in range(5)]
    [done] = _of(events, "completed")
    assert done.trials == 5 and done.failed_trials == 0
    # The budget clock counted the time no tuner ran (over 2 s) as downtime.
    assert done.downtime_s >= 1.5


async def test_a_trial_asked_but_never_committed_is_failed_before_the_next_ask(db: str) -> None:
    requested = _requested().payload
    space = search.build(requested.run_candidates)
    session_id = requested.session_id
    study.create(db, session_id, [])
    lost, _, _ = study.ask(db, session_id, space, seed=0, dropped={}, known=[])
    # A tuner that died before committing trial `lost` left no row for it.
    number, params, seeded = study.ask(db, session_id, space, seed=0, dropped={}, known=[])
    assert number == lost + 1 and not seeded
    stored = optuna.load_study(study_name=session_id, storage=study.storage(db))
    assert stored.trials[lost].state.name == "FAIL"
    assert stored.trials[number].state.name == "RUNNING"
    # Once committed (known), a running trial is left alone.
    study.ask(db, session_id, space, seed=0, dropped={}, known=[number])
    assert (
        optuna.load_study(study_name=session_id, storage=study.storage(db)).trials[number].state.name
        == "RUNNING"
    )


async def _bench_requested(lab: Lab, n: int) -> Envelope[BenchRequested]:
    """The tuner's `bench.requested` of trial `n`, once the lab has it."""
    for _ in range(600):
        if len(lab.requested) > n:
            return lab.requested[n]
        await asyncio.sleep(0.05)
    raise TimeoutError(f"trial {n}'s bench was not requested")


async def test_benches_that_cannot_run_fail_their_trial_and_the_session_goes_on(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5, max_trials=3)
    session_id = requested.payload.session_id
    lab = Lab(nats_url, lambda trial, cid: (1.3, 0.02, True), hold={0, 1})
    async with lab.running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        first = await _bench_requested(lab, 0)
        # The benchmark-runner could not run trial 0's bench at all.
        cannot = RunFailed(run_id=session_id, error_stage=ErrorStage.BENCHMARK, message="out of memory")
        await publish(js, first.follow(cannot, producer="benchmark-runner"))
        second = await _bench_requested(lab, 1)
        # It gave up on trial 1's request and parked it.
        letter = DeadLetter(
            service="benchmark_runner",
            subject=second.subject,
            data=base64.b64encode(second.to_json_bytes()),
            deliveries=5,
            error="RuntimeError: boom",
        )
        await publish_raw(js, dlq_subject("benchmark_runner"), letter.model_dump_json().encode(), {})
        await _bench_requested(lab, 2)
        await lab.answer(js, lab.requested[2])
        events = await _session_events(js, session_id)

    trials = [t.result for t in _of(events, "trial_completed")]
    assert [(t.trial, t.state, t.error_stage) for t in trials] == [
        (0, "failed", ErrorStage.BENCHMARK),
        (1, "failed", ErrorStage.DEAD_LETTER),
        (2, "complete", None),
    ]
    assert trials[0].error_message == "out of memory" and "boom" in trials[1].error_message
    [done] = _of(events, "completed")
    assert done.failed_trials == 2 and done.best.trial == 2


async def test_a_target_that_cannot_load_fails_the_session(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5)
    session_id = requested.payload.session_id
    lab = Lab(nats_url, lambda trial, cid: (1.3, 0.02, True), hold={0})
    async with lab.running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        first = await _bench_requested(lab, 0)
        cannot = RunFailed(run_id=session_id, error_stage=ErrorStage.MODEL_LOAD, message="no such model")
        await publish(js, first.follow(cannot, producer="benchmark-runner"))
        events = await _session_events(js, session_id, end="failed")

    [failed] = _of(events, "failed")
    assert failed.error_stage == ErrorStage.MODEL_LOAD and "no such model" in failed.message
    assert _of(events, "completed") == []
    assert bus.sql(db, "SELECT state, error_stage FROM tuner_trials") == [("failed", "model_load")]


async def test_a_trial_still_running_past_the_deadline_is_cut(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.05)  # 3 s; the test tuner's grace is 3 s more
    session_id = requested.payload.session_id
    lab = Lab(nats_url, lambda trial, cid: (1.3, 0.02, True), hold={0})
    async with lab.running(), running_tuner(db, nats_url, TUNER):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    [trial] = [t.result for t in _of(events, "trial_completed")]
    assert trial.state == "failed" and trial.error_stage == ErrorStage.TIMEOUT
    assert "cut by the budget" in trial.error_message
    [done] = _of(events, "completed")
    assert done.reason == logic.STOP_BUDGET and done.winner is None and done.elapsed_s >= 6.0


async def test_the_session_says_which_dimensions_it_found_insensitive(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(budget_minutes=0.5, max_trials=7, families=["ngram"])
    session_id = requested.payload.session_id
    speed_of_k: dict[int, float] = {}

    def script(trial: int, cid: str) -> tuple[float, float, bool]:
        # Only k matters: the match window (ngram_min, ngram_max) changes nothing.
        k = int(cid.split("-k")[1].split("-")[0])
        return speed_of_k.setdefault(k, 1.0 + 0.03 * k), 0.01, True

    tuner = dataclasses.replace(TUNER, narrow_after=3)
    async with Lab(nats_url, script).running(), running_tuner(db, nats_url, tuner):
        await publish(js, requested)
        events = await _session_events(js, session_id)

    narrowings = _of(events, "space_narrowed")
    assert narrowings, "importances were computed after 3 complete trials but never published"
    first = narrowings[0]
    assert first.after_trials == 3
    assert set(first.importances) <= {"ngram.k", "ngram.ngram_min", "ngram.ngram_max"}
    assert abs(sum(first.importances.values()) - 1.0) < 1e-6
    best = next(t.best for t in reversed(_of(events, "improved")) if t.best.trial < 3)
    for name, value in first.dropped.items():
        assert first.importances[name] < 0.05 and best.params[name] == value


async def test_an_opted_out_tenants_session_completes_as_speculation_disabled(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    """F-S3: the tuner learns the opt-out from `security.policy_changed` (as the security service
    publishes it) and ends the tenant's session at once: no trial, no bench requested."""
    policy = SecurityPolicy(
        tenant_id=TENANT, version=1, tier="multi_tenant_isolated", speculation_opt_out=True
    )
    changed = new_event(
        PolicyChanged(tenant_id=TENANT, policy=policy),
        tenant_id=TENANT,
        correlation_id=TENANT,
        producer="security",
    )
    requested = _requested(budget_minutes=0.5, max_trials=4)
    session_id = requested.payload.session_id

    async with (
        Lab(nats_url, lambda trial, cid: (1.5, 0.02, True)).running() as lab,
        running_tuner(db, nats_url, TUNER),
    ):
        await publish(js, changed)
        await _until_folded(db)
        await publish(js, requested)
        events = await _session_events(js, session_id)

    [done] = _of(events, "completed")
    assert done.speculation_disabled == OPT_OUT_REASON and done.reason == OPT_OUT_REASON
    assert done.winner is None and done.trials == 0
    assert _of(events, "started") == [] and _of(events, "trial_completed") == []
    assert lab.requested == [] and await bus.count(js, "spec.bench.*.requested") == 0


async def _until_folded(db: str) -> None:
    """Wait until the tuner's read model holds the tenant's opt-out."""
    for _ in range(int(bus.WAIT_S / 0.1)):
        if bus.sql(
            db, "SELECT 1 FROM tuner_policies WHERE tenant_id = %s AND speculation_disabled", (TENANT,)
        ):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the tuner did not fold the policy")
