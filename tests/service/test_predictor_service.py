"""The predictor service on a real nats-server and PostgreSQL; the benchmark-runner and the
quality gate are played by the test, which publishes their events as they would (or, for
the dead letters, by a benchmark-runner whose every attempt fails). Where a user would see
the outcome through the gateway (its winner cache, a failed run), the gateway runs too."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from fixtures import bus
from fixtures.gateway import RUNS, run_body, running_gateway
from httpx_sse import EventSource
from nats.js import JetStreamContext
from psycopg.types.json import Jsonb

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope, new_event
from specbus.publish import MSG_ID, envelope_headers, publish_raw
from specbus.subjects import STREAM, dlq_subject
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import BASELINE_ID, Measurement
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import (
    BenchCompleted,
    BenchPlan,
    BenchRequested,
    GateEvaluated,
    RunFailed,
    RunQueued,
    RunRequested,
    parse_event,
)
from specops_services.benchmark_runner.app import subscribe as subscribe_runner
from specops_services.benchmark_runner.protocol import BenchOutcome, RepCallback, RepRow
from specops_services.benchmark_runner.runner import BenchmarkRunnerSettings, BenchRunner
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool

TENANT = "acme"
OTHER_TENANT = "globex"
SMOLLM = "smollm2-135m-instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
BASE_TOKENS_PER_S = 10.0
CPU_HOST = HostInfo(cuda=False)


def _request(model: str = SMOLLM, gpu: str = "cpu", engine: str = "speccore") -> RunCreateRequest:
    return RunCreateRequest.model_validate(
        {"target": {"model_ref": model, "gpu": gpu, "engine": engine}, "workload": {"fingerprint": "chat"}}
    )


def _requested(dsn: str, request: RunCreateRequest, tenant: str = TENANT) -> Envelope[RunRequested]:
    """A run as the gateway creates it: its row (queued), then its `run.requested`."""
    run_id = str(uuid.uuid4())
    bus.sql(dsn, "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING", (tenant, tenant))
    bus.sql(
        dsn,
        "INSERT INTO runs (id, tenant_id, request) VALUES (%s, %s, %s)",
        (run_id, tenant, Jsonb(request.model_dump(mode="json"))),
    )
    payload = RunRequested(run_id=run_id, request=request, requested_by="token-1")
    return new_event(payload, tenant_id=tenant, correlation_id=run_id, producer="gateway")


def _measurement(candidate_id: str, speedup: float, acceptance: float = 0.5, depth: int = 1) -> Measurement:
    """A measured candidate whose every draft position is accepted at ``acceptance`` (a chain of
    ``depth``: its mean acceptance length follows)."""
    return Measurement(
        candidate_id=candidate_id,
        reps=2,
        tokens_per_s=BASE_TOKENS_PER_S * speedup,
        tokens_per_s_stdev=0.1,
        speedup=speedup,
        acceptance_rate=acceptance,
        mean_acceptance_length=sum(acceptance**i for i in range(depth + 1)),
        per_position_acceptance=[acceptance**i for i in range(1, depth + 1)],
        ttft_s=0.05,
        tpot_s=1.0 / (BASE_TOKENS_PER_S * speedup),
        extra_memory_bytes=0,
    )


def _bench_completed(
    request: Envelope[BenchRequested], speedups: Mapping[str, float], acceptance: float = 0.5
) -> Envelope[BenchCompleted]:
    """What the benchmark-runner publishes once it measured every candidate and the baseline."""
    depth = {c.candidate_id: c.k for c in request.payload.plan.candidates}
    payload = BenchCompleted(
        bench_id=request.payload.bench_id,
        plan=request.payload.plan,
        baseline=_measurement(BASELINE_ID, 1.0, acceptance=0.0),
        results=[_measurement(cid, s, acceptance, depth[cid]) for cid, s in speedups.items()],
    )
    return request.follow(payload, producer="benchmark-runner")


def _verdict(done: Envelope[BenchCompleted], candidate_id: str, passed: bool) -> Envelope[GateEvaluated]:
    """The quality gate's `gate.evaluated` for one measured candidate."""
    payload = GateEvaluated(
        bench_id=done.payload.bench_id,
        candidate_id=candidate_id,
        method=GateMethod.TOPK5,
        passed=passed,
        score=0.99 if passed else 0.5,
        threshold=0.95,
    )
    return done.follow(payload, producer="quality-gate")


def _predictor(db: str, nats_url: str, host: HostInfo = CPU_HOST) -> AbstractAsyncContextManager[str]:
    """The predictor's consumers and outbox relay on this test's database; yields its service name."""

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, Planner(host=host), service=service, retry=FAST, fetch_timeout_s=0.5)

    return bus.serving(db, nats_url, "pred", register)


async def _run_events(js: JetStreamContext, run_id: str, at_least: int) -> list[Envelope[Any]]:
    """The run's events after its `run.requested`, in stream order."""
    events = await bus.events(js, f"spec.run.{run_id}.*", at_least=at_least + 1)
    return [e for e in events if e.type != "run.requested"]


async def _planned(js: JetStreamContext, run_id: str) -> Envelope[BenchRequested]:
    """The bench the predictor requested for a run, once the run is planned."""
    [predicted] = await bus.events(js, f"spec.run.{run_id}.predicted")
    [bench] = [e for e in await bus.events(js, "spec.bench.*.requested") if e.correlation_id == run_id]
    assert bench.payload.plan.run_id == run_id
    assert {c.candidate_id for c in bench.payload.plan.candidates} <= {
        c.candidate.candidate_id for c in predicted.payload.candidates
    }
    return bench


async def test_measured_run_completes_once_every_verdict_is_in(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(db, _request())
    run_id = requested.correlation_id
    async with running_gateway(db, nats_url) as gw, _predictor(db, nats_url) as service:
        await publish(js, requested)
        bench = await _planned(js, run_id)
        stream = await _run_events(js, run_id, at_least=3)
        assert stream[0].type == "run.running"
        assert stream[0].payload.stage == "predicting"
        stages = [e.payload.stage for e in stream if e.type == "run.running"]
        assert stages == ["predicting", "measuring"]
        assert all(e.correlation_id == run_id and e.tenant_id == TENANT for e in stream)

        first, second, third = (c.candidate_id for c in bench.payload.plan.candidates)
        speedups = {first: 1.2, second: 1.6, third: 0.9}
        done = _bench_completed(bench, speedups, acceptance=0.9)
        verdicts = {cid: _verdict(done, cid, passed=True) for cid in speedups}
        # Verdicts may overtake the bench: nothing is answered until all of them and the bench are in.
        await publish(js, verdicts[first])
        ack = await publish(js, verdicts[second])
        await bus.acked(js, consumer_name(service, "gate_evaluated"), ack)
        await bus.acked(js, consumer_name(service, "bench_completed"), await publish(js, done))
        assert bus.sql(db, "SELECT count(*) FROM outbox WHERE subject LIKE 'spec.run.%.completed'") == [(0,)]
        await publish(js, verdicts[third])
        [completed] = await bus.events(js, f"spec.run.{run_id}.completed")
        await gw.wait_status(run_id, "completed")
        # The identical request right after is answered from the winner cache.
        hit = await gw.create(body=run_body(model_ref=SMOLLM, gpu="cpu", engine="speccore"))

    answer = completed.payload
    assert answer.measured is True and answer.cache_hit is False
    assert answer.winner is not None and answer.winner.candidate.candidate_id == second
    assert answer.winner.measurement is not None and answer.winner.measurement.speedup == 1.6
    assert completed.causation_id == verdicts[third].event_id
    measured = {c.candidate.candidate_id for c in answer.candidates if c.measurement is not None}
    assert measured == set(speedups)
    assert second in answer.pareto_front

    assert hit.status_code == 200, hit.text
    cached = hit.json()
    assert cached["status"] == "completed" and cached["cache_hit"] is True and cached["measured"] is True
    assert cached["winner"] == answer.winner.model_dump(mode="json")
    # Cached for 30 days, from this run.
    fresh = """SELECT count(*) FROM winner_cache
               WHERE source_run_id = %s AND expires_at > now() + interval '29 days'"""
    assert bus.sql(db, fresh, (run_id,)) == [(1,)]
    history = bus.sql(
        db, "SELECT family, k, acceptance_rate, gpu FROM measured_history WHERE run_id = %s", (run_id,)
    )
    assert len(history) == 3 and {row[3] for row in history} == {"cpu"}


async def _measured(js: JetStreamContext, requested: Envelope[RunRequested]) -> str:
    """Measure a run to its answer, its first candidate far better than predicted; that candidate's id."""
    await publish(js, requested)
    bench = await _planned(js, requested.correlation_id)
    cid = bench.payload.plan.candidates[0].candidate_id
    done = _bench_completed(bench, {cid: 2.5}, acceptance=0.95)
    await publish(js, done)
    await publish(js, _verdict(done, cid, passed=True))
    await bus.events(js, f"spec.run.{requested.correlation_id}.completed")
    return cid


async def _predictions(js: JetStreamContext, requested: Envelope[RunRequested]) -> dict[str, Any]:
    """The prediction of each candidate of a run's `run.predicted`, by candidate id."""
    [predicted] = await bus.events(js, f"spec.run.{requested.correlation_id}.predicted")
    return {c.candidate.candidate_id: c.prediction for c in predicted.payload.candidates}


async def test_history_refines_the_next_prediction(db: str, nats_url: str, js: JetStreamContext) -> None:
    async with _predictor(db, nats_url):
        before = _requested(db, _request())
        cid = await _measured(js, before)
        after = _requested(db, _request())
        await publish(js, after)
        first = (await _predictions(js, before))[cid]
        second = (await _predictions(js, after))[cid]

    assert second.acceptance_rate > first.acceptance_rate
    assert second.speedup > first.speedup


async def test_another_tenants_history_changes_no_prediction(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    """F-S1 (issue 20): what tenant A measured reaches no plan of tenant B's, in any tier (the
    predictor scopes its history per tenant always; a single-tenant deployment has one)."""
    async with _predictor(db, nats_url):
        # B's prediction with no history anywhere.
        alone = _requested(db, _request(), tenant=OTHER_TENANT)
        await publish(js, alone)
        without_history = await _predictions(js, alone)
        # A measures the same workload, far better than predicted; A's next plan learns from it.
        cid = await _measured(js, _requested(db, _request()))
        again = _requested(db, _request())
        after = _requested(db, _request(), tenant=OTHER_TENANT)
        await publish(js, again)
        await publish(js, after)
        learned = await _predictions(js, again)
        with_a_history = await _predictions(js, after)

    assert learned[cid] != without_history[cid]
    assert with_a_history == without_history
    rows = bus.sql(db, "SELECT DISTINCT tenant_id FROM measured_history")
    assert rows == [(TENANT,)]


async def test_a_failed_gate_disqualifies_the_fastest(db: str, nats_url: str, js: JetStreamContext) -> None:
    async with _predictor(db, nats_url):
        runs = {name: _requested(db, _request()) for name in ("fastest_fails", "all_fail")}
        for event in runs.values():
            await publish(js, event)
        answers = {}
        for name, event in runs.items():
            bench = await _planned(js, event.correlation_id)
            ids = [c.candidate_id for c in bench.payload.plan.candidates]
            speedups = dict(zip(ids, (2.0, 1.5, 1.1), strict=True))
            failing = {ids[0]} if name == "fastest_fails" else set(ids)
            done = _bench_completed(bench, speedups)
            await publish(js, done)
            for cid in ids:
                await publish(js, _verdict(done, cid, passed=cid not in failing))
            [completed] = await bus.events(js, f"spec.run.{event.correlation_id}.completed")
            answers[name] = (ids, completed.payload)

    ids, answer = answers["fastest_fails"]
    assert answer.winner is not None and answer.winner.candidate.candidate_id == ids[1]
    [fastest] = [c for c in answer.candidates if c.candidate.candidate_id == ids[0]]
    assert fastest.error_stage == ErrorStage.QUALITY_REGRESSION and fastest.quality_preserved == 0.0
    assert fastest.candidate.candidate_id not in answer.pareto_front

    _, nothing = answers["all_fail"]
    assert nothing.measured is True and nothing.winner is None
    run_id = runs["all_fail"].correlation_id
    assert bus.sql(db, "SELECT count(*) FROM measured_history WHERE run_id = %s", (run_id,)) == [(0,)]
    # A disqualified candidate's acceptance is not learned from.
    fastest_run = runs["fastest_fails"].correlation_id
    assert bus.sql(db, "SELECT count(*) FROM measured_history WHERE run_id = %s", (fastest_run,)) == [(2,)]


async def test_a_target_not_measurable_here_gets_the_predicted_best(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(db, _request(LLAMA_70B, gpu="H100-80GB", engine="vllm"))
    run_id = requested.correlation_id
    async with running_gateway(db, nats_url) as gw, _predictor(db, nats_url):
        await publish(js, requested)
        [completed] = await bus.events(js, f"spec.run.{run_id}.completed")
        stream = await _run_events(js, run_id, at_least=3)
        assert await bus.count(js, "spec.bench.*.requested") == 0
        await gw.wait_status(run_id, "completed")
        # The same request right after (`h100` is the same profile) is answered from the cache.
        hit = await gw.create(body=run_body(model_ref=LLAMA_70B, gpu="h100", engine="vllm"))

    answer = completed.payload
    assert answer.measured is False and answer.cache_hit is False
    assert answer.winner is not None and answer.winner.measurement is None
    assert stream[0].type == "run.running" and stream[0].payload.stage == "predicting"
    assert sorted(e.type for e in stream) == ["run.completed", "run.predicted", "run.running"]
    assert hit.status_code == 200, hit.text
    cached = hit.json()
    assert cached["cache_hit"] is True and cached["measured"] is False
    assert cached["winner"] == answer.winner.model_dump(mode="json")


async def test_an_unknown_gpu_fails_the_run_as_validation(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(db, _request(gpu="TPU-v9"))
    run_id = requested.correlation_id
    async with _predictor(db, nats_url):
        await publish(js, requested)
        [failed] = await bus.events(js, f"spec.run.{run_id}.failed")
    assert failed.payload.error_stage == ErrorStage.VALIDATION
    assert "TPU-v9" in failed.payload.message
    assert await bus.count(js, f"spec.run.{run_id}.predicted") == 0
    assert bus.sql(db, "SELECT count(*) FROM candidates WHERE run_id = %s", (run_id,)) == [(0,)]


async def test_a_redelivered_request_is_planned_once(db: str, nats_url: str, js: JetStreamContext) -> None:
    requested = _requested(db, _request())
    run_id = requested.correlation_id
    async with _predictor(db, nats_url) as service:
        await publish(js, requested)
        # The same event again after the broker's dedup window (another Nats-Msg-Id).
        headers = envelope_headers(requested) | {MSG_ID: f"again-{requested.event_id}"}
        again = await publish_raw(js, requested.subject, requested.to_json_bytes(), headers)
        assert not again.duplicate
        await bus.acked(js, consumer_name(service, "plan"), again)
        await _planned(js, run_id)
        # Give the relay time to publish anything a second plan would have queued.
        await asyncio.sleep(0.6)
        assert await bus.count(js, "spec.bench.*.requested") == 1
        assert await bus.count(js, f"spec.run.{run_id}.predicted") == 1
        assert await bus.count(js, f"spec.run.{run_id}.running") == 2
    assert bus.sql(db, "SELECT count(*) FROM benches WHERE run_id = %s", (run_id,)) == [(1,)]


class _BrokenRunner(BenchRunner):
    """A benchmark-runner on which every attempt fails, as with a bug or a dependency gone for good."""

    def measure(
        self,
        plan: BenchPlan,
        on_rep: RepCallback,
        done: Iterable[RepRow] = (),
        stop: threading.Event | None = None,
        *,
        tenant_id: str | None = None,
    ) -> BenchOutcome:
        raise RuntimeError("boom")


def _broken_runner(db: str, nats_url: str) -> AbstractAsyncContextManager[str]:
    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        runner = _BrokenRunner(BenchmarkRunnerSettings())
        subscribe_runner(broker, pool, runner, service=service, retry=FAST, fetch_timeout_s=0.5)

    return bus.serving(db, nats_url, "br", register)


def _letter(parked: bytes) -> bytes:
    """A dead letter of the quality gate's, keeping `parked` as the body it gave up on."""
    letter = DeadLetter(
        service="quality_gate",
        subject="spec.bench.b-1.completed",
        data=base64.b64encode(parked),
        deliveries=5,
        error="ValueError: x",
    )
    return letter.model_dump_json().encode()


async def test_a_parked_bench_fails_its_run_once_and_the_gateway_shows_it(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    body = run_body(model_ref=SMOLLM, gpu="cpu", engine="speccore")
    async with (
        running_gateway(db, nats_url) as gw,
        _predictor(db, nats_url) as predictor,
        _broken_runner(db, nats_url) as runner,
    ):
        created = await gw.create(body=body)
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        failed = await gw.wait_status(run_id, "failed")
        # The stream of a failed run ends at its run.failed (ASGITransport returns then).
        stream = await gw.client.get(f"{RUNS}/{run_id}/events", headers=gw.auth())
        sse = [m for m in EventSource(stream).iter_sse() if m.data]

        dlq = dlq_subject(runner)
        parked = await js.get_last_msg(STREAM, dlq)
        letter = DeadLetter.model_validate_json(parked.data)
        durable = consumer_name(predictor, "dead_letter")
        # The same dead letter delivered again (re-published past the broker's dedup window).
        headers = {MSG_ID: f"again-{parked.seq}"}
        await bus.acked(js, durable, await publish_raw(js, dlq, parked.data, headers))
        # Letters the predictor only logs: another of the run's events parked (the run has
        # failed already), a letter whose body is no event, one of no run.
        predicted = (await bus.events(js, f"spec.run.{run_id}.predicted"))[0]
        foreign = new_event(
            RunQueued(run_id="no-such-run"),
            tenant_id=TENANT,
            correlation_id="no-such-run",
            producer="gateway",
        )
        for i, data in enumerate([predicted.to_json_bytes(), b"{not json", foreign.to_json_bytes()]):
            ack = await publish_raw(js, dlq_subject("quality_gate"), _letter(data), {MSG_ID: f"other-{i}"})
        await bus.acked(js, durable, ack)
        await asyncio.sleep(0.6)  # time for the relay to publish anything those queued

        [run_failed] = await bus.events(js, "spec.run.*.failed")
        assert await bus.count(js, dlq_subject(predictor)) == 0

    bench = letter.subject.split(".")[2]
    assert (letter.service, letter.subject, letter.deliveries) == (runner, f"spec.bench.{bench}.requested", 3)
    assert letter.error == "RuntimeError: boom"
    assert parse_event(letter.data).correlation_id == run_id

    assert run_failed.correlation_id == run_id and run_failed.tenant_id == TENANT
    assert run_failed.causation_id == parse_event(letter.data).event_id
    assert run_failed.payload.error_stage == ErrorStage.DEAD_LETTER
    error = failed["error"]
    assert error == {"error_stage": "dead_letter", "message": run_failed.payload.message}
    assert runner in error["message"] and "bench.requested" in error["message"]
    assert "RuntimeError: boom" in error["message"]
    assert [m.event for m in sse][-1] == "run.failed"
    assert [m.event for m in sse].count("run.failed") == 1
    # Open: a redrive of the parked bench.requested may still answer the run.
    answered = "SELECT finalized_at IS NULL, failed_at IS NOT NULL FROM benches WHERE run_id = %s"
    assert bus.sql(db, answered, (run_id,)) == [(True, False)]


async def test_a_run_failed_by_a_parked_message_completes_when_the_redriven_message_answers_it(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(db, _request())
    run_id = requested.correlation_id
    async with running_gateway(db, nats_url) as gw, _predictor(db, nats_url) as service:
        await publish(js, requested)
        bench = await _planned(js, run_id)
        cids = [c.candidate_id for c in bench.payload.plan.candidates]
        done = _bench_completed(bench, dict.fromkeys(cids, 1.3))
        # The quality gate gives up on the bench.completed: the run fails...
        await publish_raw(js, dlq_subject("quality_gate"), _letter(done.to_json_bytes()), {MSG_ID: run_id})
        failed = await gw.wait_status(run_id, "failed")
        # ...until the letter is redriven, the gate (fixed) takes it and gives its verdicts.
        await bus.acked(js, consumer_name(service, "bench_completed"), await publish(js, done))
        for cid in cids:
            await publish(js, _verdict(done, cid, passed=True))
        completed = await gw.wait_status(run_id, "completed")
        await asyncio.sleep(0.6)  # time for the relay to publish anything else that queued

    assert (
        failed["error"]["error_stage"] == "dead_letter"
        and "specops dlq redrive" in failed["error"]["message"]
    )
    assert completed["error"] is None and completed["winner"] is not None
    assert await bus.count(js, f"spec.run.{run_id}.completed") == 1
    assert await bus.count(js, f"spec.run.{run_id}.failed") == 1


async def test_a_parked_request_fails_its_run_though_the_predictor_never_took_it(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # E.g. the database was down through every delivery of the request to the predictor.
    requested = _requested(db, _request())
    run_id = requested.correlation_id
    async with _predictor(db, nats_url):
        letter = _letter(requested.to_json_bytes())
        await publish_raw(js, dlq_subject("predictor"), letter, {MSG_ID: "parked-request"})
        [failed] = await bus.events(js, f"spec.run.{run_id}.failed")
    assert failed.payload.error_stage == ErrorStage.DEAD_LETTER
    assert failed.causation_id == requested.event_id
    assert await bus.count(js, f"spec.run.{run_id}.predicted") == 0


async def test_a_run_another_service_failed_is_not_failed_again_by_a_dead_letter(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    requested = _requested(db, _request())
    run_id = requested.correlation_id
    async with _predictor(db, nats_url) as predictor:
        await publish(js, requested)
        bench = await _planned(js, run_id)
        # The benchmark-runner cannot load the target: it ends the run itself.
        stop = bench.follow(
            RunFailed(run_id=run_id, error_stage=ErrorStage.MODEL_LOAD, message="no weights"),
            producer="benchmark-runner",
        )
        await bus.acked(js, consumer_name(predictor, "run_failed"), await publish(js, stop))
        # Then a service gives up on one of the run's events.
        letter = _letter(bench.to_json_bytes())
        ack = await publish_raw(js, dlq_subject("quality_gate"), letter, {MSG_ID: "late-letter"})
        await bus.acked(js, consumer_name(predictor, "dead_letter"), ack)
        await asyncio.sleep(0.6)  # time for the relay to publish anything that queued
        [failed] = await bus.events(js, f"spec.run.{run_id}.failed")
    assert failed.event_id == stop.event_id


_SERVE = (
    "import argparse, sys\n"
    "from specops.commands import serve\n"
    "parser = argparse.ArgumentParser()\n"
    "serve.add_parsers(parser.add_subparsers())\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.handler(args))\n"
)


async def test_serve_logs_each_event_and_stops_on_sigterm(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    env = os.environ | {
        "NATS_URL": nats_url,
        "DATABASE_URL": db,
        "SPECOPS_STATE_DIR": str(tmp_path),
        "SPECOPS_HOST_GPU": "cpu",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, "serve", "predictor", "--replica", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        requested = _requested(db, _request())
        await publish(js, requested)
        await bus.events(js, "spec.bench.*.requested")
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    handled = [
        line for line in stderr.splitlines() if f"run.requested run={requested.correlation_id}" in line
    ]
    assert len(handled) == 1 and "predictor[1]" in handled[0], stderr
    assert "bench.requested" in handled[0]
