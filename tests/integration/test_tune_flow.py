"""A T2 session through the real services, as `specops up` starts them: the tuner asks, the
benchmark-runner measures each trial with the real model (smollm2, TINY benches), the quality
gate gates it, and the session completes with its curve. The gateway's endpoints are not
used: the test publishes the `tune.requested` the gateway would."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
import torch
from fixtures.runtime import TINY, started
from nats.js import JetStreamContext

from specbus import publish
from specbus.envelope import Envelope, new_event
from specbus.subjects import STREAM
from specops.runtime.supervisor import status
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import CandidateResult
from specops_schemas.events import parse_event
from specops_schemas.tune import TuneRequested, TuneSessionCreateRequest
from specops_services.predictor.plan import HostInfo, plan_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TUNE_ENV = {**TINY, "SPECOPS_TUNER_REPS": "2", "SPECOPS_TUNER_PROMPTS": "1", "SPECOPS_TUNER_NEW_TOKENS": "8"}
WAIT_S = 600.0


def _requested(max_trials: int = 2) -> Envelope[TuneRequested]:
    run = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": "code"},
        }
    )
    plan = plan_run(run, run_id="run-1", host=HostInfo(cuda=False))
    rows = [CandidateResult(candidate=r.candidate, prediction=r.prediction) for r in plan.ranked]
    session_id = str(uuid.uuid4())
    request = TuneSessionCreateRequest(
        run_id=str(uuid.uuid4()), budget_minutes=8.0, max_trials=max_trials, families=["ngram"]
    )
    payload = TuneRequested(
        session_id=session_id,
        request=request,
        run_request=run,
        run_candidates=rows,
        run_pareto_front=[r.candidate.candidate_id for r in rows if r.candidate.family == "ngram"][:1],
        run_winner=None,
        requested_by="token-1",
    )
    return new_event(payload, tenant_id="acme", correlation_id=session_id, producer="gateway")


async def _session(
    nats_url: str,
    seed: str,
    requested: Envelope[TuneRequested],
    meanwhile: Callable[[JetStreamContext], Awaitable[None]] | None = None,
) -> list[Envelope[Any]]:
    """Publish the request, do `meanwhile` (if given), then every event of the session once it completed."""
    nc = await nats.connect(nats_url, nkeys_seed=seed)
    try:
        js = nc.jetstream()
        await publish(js, requested)
        if meanwhile is not None:
            await meanwhile(js)
        session_id = requested.payload.session_id
        deadline = time.monotonic() + WAIT_S
        subject = f"spec.tune.{session_id}.*"
        while True:
            info = await js.stream_info(STREAM, subjects_filter=f"spec.tune.{session_id}.completed")
            if sum((info.state.subjects or {}).values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {session_id} did not complete in {WAIT_S:g} s")
            await asyncio.sleep(1.0)
        sub = await js.pull_subscribe(subject, stream=STREAM)
        msgs = await sub.fetch(100, timeout=5)
        return [parse_event(m.data) for m in msgs]
    finally:
        await nc.close()


def test_a_tune_session_through_every_service(monkeypatch: pytest.MonkeyPatch) -> None:
    requested = _requested()
    with started(monkeypatch, env=TUNE_ENV) as runtime:
        events = asyncio.run(_session(runtime.nats_url, runtime.admin_seed, requested))
    types = [e.type for e in events]
    assert types[0] == "tune.requested" and types[1] == "tune.started" and types[-1] == "tune.completed", (
        types
    )
    trials = [e.payload.result for e in events if e.type == "tune.trial_completed"]
    assert [t.trial for t in trials] == [0, 1]
    assert trials[0].seeded
    for t in trials:
        # Measured by the benchmark-runner (2 reps: a mean and a sigma) and gated (ngram is lossless).
        assert t.state == "complete", t
        assert t.measurement is not None and t.measurement.reps == 2
        assert t.speedup_stdev is not None and t.gate is not None and t.gate.passed
    done = events[-1].payload
    assert done.trials == 2 and len(done.curve) == 2 and done.reason == "max_trials reached"


def _tuner_pid(settings: Any) -> int | None:
    return next((p.pid for p in status(settings).processes if p.service == "tuner" and p.alive), None)


def test_a_tuner_killed_mid_trial_resumes_without_losing_or_doubling_a_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requested = _requested(max_trials=4)
    env = {**TUNE_ENV, "SPECOPS_TUNER_TICK_S": "0.5"}
    with started(monkeypatch, env=env) as runtime:
        killed: list[int] = []

        async def kill_mid_trial(js: JetStreamContext) -> None:
            # Trial 1's bench is requested: the tuner is killed while it is measured.
            deadline = time.monotonic() + WAIT_S
            while True:
                info = await js.stream_info(STREAM, subjects_filter="spec.bench.*.requested")
                if sum((info.state.subjects or {}).values()) >= 2:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("trial 1 was never requested")
                await asyncio.sleep(0.2)
            pid = _tuner_pid(runtime.settings)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        events = asyncio.run(_session(runtime.nats_url, runtime.admin_seed, requested, kill_mid_trial))
        restarted = _tuner_pid(runtime.settings)
        benches = asyncio.run(_bench_events(runtime.nats_url, runtime.admin_seed))
    assert killed and restarted not in (None, killed[0])
    trials = [e.payload.result for e in events if e.type == "tune.trial_completed"]
    numbers = [t.trial for t in trials]
    assert len(numbers) == 4 and len(set(numbers)) == 4 and all(t.state == "complete" for t in trials)
    # Each trial's bench requested once and measured once.
    requested_ids = [e.payload.bench_id for e in benches if e.type == "bench.requested"]
    completed_ids = [e.payload.bench_id for e in benches if e.type == "bench.completed"]
    assert sorted(requested_ids) == sorted(completed_ids) == sorted(t.bench_id for t in trials)
    done = events[-1].payload
    assert done.trials == 4 and done.failed_trials == 0
    assert done.downtime_s > 0.0  # the restart's gap counted against the budget


async def _bench_events(nats_url: str, seed: str) -> list[Envelope[Any]]:
    nc = await nats.connect(nats_url, nkeys_seed=seed)
    try:
        sub = await nc.jetstream().pull_subscribe("spec.bench.>", stream=STREAM)
        msgs = await sub.fetch(200, timeout=5)
        return [parse_event(m.data) for m in msgs]
    finally:
        await nc.close()
