"""The benchmark-runner service on a real nats-server, PostgreSQL and smollm2; killed mid-bench too."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import psycopg
import pytest
from fixtures import bus
from fixtures.process import service_process
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.envelope import Envelope, new_event
from specbus.subjects import STREAM, dlq_subject
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from specops_schemas.api import Target
from specops_schemas.candidates import BASELINE_ID, Candidate
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import BenchPlan, BenchRequested
from specops_services.benchmark_runner.app import HANDLER, SERVICE, subscribe
from specops_services.benchmark_runner.runner import BenchmarkRunnerSettings, BenchRunner
from specplatform.db import Pool

TENANT = "acme"
MODEL = "smollm2-135m-instruct"
NGRAM = Candidate(candidate_id="ngram-k4", family="ngram", k=4)
SETTINGS = BenchmarkRunnerSettings(bench_device="cpu", bench_dtype="float32", threads=2)
# ack_wait well below the time the bench takes here: heartbeats must keep the message.
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=2.0)
WAIT_S = 60.0


def _bench_requested(dsn: str, *, reps: int, model: str = MODEL) -> Envelope[BenchRequested]:
    """A bench of a run the gateway opened, as the predictor requests it."""
    run_id, bench_id = f"run-{uuid.uuid4().hex[:10]}", f"bench-{uuid.uuid4().hex[:10]}"
    bus.open_run(dsn, TENANT, run_id)
    plan = BenchPlan(
        run_id=run_id,
        target=Target(model_ref=model, gpu="cpu", engine="speccore"),
        fingerprint="chat",
        mode="interactive",
        quality_gate="topk5",
        candidates=[NGRAM],
        reps=reps,
        n_prompts=2,
        max_new_tokens=8,
    )
    payload = BenchRequested(bench_id=bench_id, plan=plan)
    return new_event(payload, tenant_id=TENANT, correlation_id=run_id, producer="predictor")


def _loader(calls: list[str], model: LoadedModel) -> Callable[[str, str, str], LoadedModel]:
    def load(ref: str, device: str, dtype: str) -> LoadedModel:
        calls.append(ref)
        return model

    return load


def _runner_service(db: str, nats_url: str, runner: BenchRunner) -> AbstractAsyncContextManager[str]:
    """The service's consumer and outbox relay in this process; yields its service name."""

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, runner, service=service, retry=FAST, fetch_timeout_s=0.5)

    return bus.serving(db, nats_url, "br", register)


def _rep_rows(dsn: str, bench_id: str) -> dict[tuple[str, int], Any]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT candidate_id, rep, metrics FROM bench_results WHERE bench_id = %s", (bench_id,)
        ).fetchall()
    return {(cid, rep): metrics for cid, rep, metrics in rows}


@pytest.mark.slow
async def test_each_rep_is_stored_and_announced_once_then_the_bench_completes(
    db: str, nats_url: str, js: JetStreamContext, smollm: LoadedModel
) -> None:
    event = _bench_requested(db, reps=2)
    bench_id, run_id = event.payload.bench_id, event.correlation_id
    loads: list[str] = []
    runner = BenchRunner(SETTINGS, ModelCache(loader=_loader(loads, smollm)))
    async with _runner_service(db, nats_url, runner) as service:
        durable = consumer_name(service, HANDLER)
        await bus.acked(js, durable, await publish(js, event))
        assert (await js.consumer_info(STREAM, durable)).num_redelivered == 0
        [done] = await bus.events(js, f"spec.bench.{bench_id}.completed", at_least=1)
        reps = await bus.events(js, f"spec.bench.{bench_id}.rep_measured", at_least=4)
        outbox_rows = len(bus.sql(db, "SELECT id FROM outbox"))

        # The same bench published again under a new event id (the broker's dedup cannot
        # catch it): every rep is stored, so nothing is measured, stored or announced again.
        again = event.model_copy(update={"event_id": str(uuid.uuid4())})
        await bus.acked(js, durable, await publish(js, again))
        assert len(bus.sql(db, "SELECT id FROM outbox")) == outbox_rows
        assert await bus.count(js, f"spec.bench.{bench_id}.completed") == 1
        assert await bus.count(js, f"spec.bench.{bench_id}.rep_measured") == 4

    assert loads == [MODEL]
    assert sorted((e.payload.candidate_id, e.payload.rep) for e in reps) == [
        (BASELINE_ID, 0),
        (BASELINE_ID, 1),
        ("ngram-k4", 0),
        ("ngram-k4", 1),
    ]
    for e in [*reps, done]:
        assert (e.tenant_id, e.correlation_id, e.causation_id) == (TENANT, run_id, event.event_id)
    stored = _rep_rows(db, bench_id)
    for e in reps:
        rep = e.payload
        assert rep.reps == 2 and rep.metrics.new_tokens > 0
        assert (rep.speedup is None) == (rep.candidate_id == BASELINE_ID)
        assert stored[(rep.candidate_id, rep.rep)] == rep.metrics.model_dump(mode="json")
    assert len(stored) == 4
    completed = done.payload
    assert completed.plan == event.payload.plan and completed.failures == []
    assert completed.baseline.reps == 2 and completed.baseline.speedup == 1.0
    [ngram] = completed.results
    assert ngram.candidate_id == "ngram-k4" and ngram.reps == 2 and ngram.speedup > 0


async def test_a_target_that_cannot_load_fails_the_run_at_once(
    db: str, nats_url: str, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline, an unknown Hugging Face id fails at once instead of after the hub's retries.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    event = _bench_requested(db, reps=2, model="no-such-org/no-such-model")
    runner = BenchRunner(SETTINGS, ModelCache())
    async with _runner_service(db, nats_url, runner) as service:
        started = time.monotonic()
        ack = await publish(js, event)
        [failed] = await bus.events(js, f"spec.run.{event.correlation_id}.failed", at_least=1)
        elapsed = time.monotonic() - started
        durable = consumer_name(service, HANDLER)
        await bus.acked(js, durable, ack)
        info = await js.consumer_info(STREAM, durable)

    assert elapsed < 10.0
    assert (failed.payload.error_stage, failed.causation_id) == (ErrorStage.MODEL_LOAD, event.event_id)
    assert "no-such-org/no-such-model" in failed.payload.message
    # Decided on the first delivery: not retried, not parked.
    assert info.num_redelivered == 0 and info.num_ack_pending == 0
    assert await bus.count(js, dlq_subject(service)) == 0
    for published in ("rep_measured", "completed"):
        assert await bus.count(js, f"spec.bench.{event.payload.bench_id}.{published}") == 0
    assert bus.sql(db, "SELECT * FROM bench_results") == []


async def _first_rows(dsn: str, bench_id: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not _rep_rows(dsn, bench_id):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no rep row stored; runner log:\n{log.read_text()[-4000:]}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_runner_killed_mid_bench_resumes_without_storing_or_announcing_a_rep_twice(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    reps = 3
    event = _bench_requested(db, reps=reps)
    bench_id = event.payload.bench_id
    env = os.environ | {
        "NATS_URL": nats_url,
        "DATABASE_URL": db,
        "SPECOPS_STATE_DIR": str(tmp_path),
        "SPECOPS_BENCH_DEVICE": "cpu",
        "SPECOPS_BENCH_DTYPE": "float32",
        "SPECOPS_THREADS": "2",
        # Redelivered 4 s after the runner dies rather than the default 15 s.
        "SPECOPS_BENCH_ACK_WAIT_S": "4",
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    log = tmp_path / "runner.log"
    ack = await publish(js, event)

    with service_process("benchmark-runner", log, env) as first:
        await _first_rows(db, bench_id, first, log)
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = _rep_rows(db, bench_id)
    assert 1 <= len(before) < 2 * reps, "the runner must die mid-bench"

    with service_process("benchmark-runner", log, env):
        [done] = await bus.events(js, f"spec.bench.{bench_id}.completed", at_least=1)
        await bus.acked(js, consumer_name(SERVICE, HANDLER), ack)
        rep_events = await bus.events(js, f"spec.bench.{bench_id}.rep_measured", at_least=2 * reps)
        assert await bus.count(js, f"spec.bench.{bench_id}.completed") == 1

    assert "resuming with" in log.read_text()
    expected = sorted((cid, rep) for cid in (BASELINE_ID, "ngram-k4") for rep in range(reps))
    after = _rep_rows(db, bench_id)
    assert sorted(after) == expected
    assert all(after[key] == metrics for key, metrics in before.items())
    # One event per (method, rep) on the bus: none stored twice in the stream, none with
    # a second event id (which the broker's dedup could not catch).
    event_ids: dict[tuple[str, int], set[str]] = {}
    for e in rep_events:
        event_ids.setdefault((e.payload.candidate_id, e.payload.rep), set()).add(e.event_id)
        assert e.payload.metrics.model_dump(mode="json") == after[(e.payload.candidate_id, e.payload.rep)]
    assert len(rep_events) == 2 * reps
    assert sorted(event_ids) == expected and all(len(ids) == 1 for ids in event_ids.values())
    completed = done.payload
    assert completed.baseline.reps == reps and completed.failures == []
    assert [(m.candidate_id, m.reps) for m in completed.results] == [("ngram-k4", reps)]
