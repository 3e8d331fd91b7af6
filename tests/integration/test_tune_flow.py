"""A T2 session through the real services, as `specops up` starts them: the tuner asks, the
benchmark-runner measures each trial with the real model (smollm2, TINY benches), the quality
gate gates it, and the session completes with its curve. The gateway's endpoints are not
used: the test publishes the `tune.requested` the gateway would."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import nats
import pytest
import torch
from fixtures.runtime import TINY, started

from specbus import publish
from specbus.envelope import Envelope, new_event
from specbus.subjects import STREAM
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


def _requested() -> Envelope[TuneRequested]:
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
        run_id=str(uuid.uuid4()), budget_minutes=8.0, max_trials=2, families=["ngram"]
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


async def _session(nats_url: str, seed: str, requested: Envelope[TuneRequested]) -> list[Envelope[Any]]:
    nc = await nats.connect(nats_url, nkeys_seed=seed)
    try:
        js = nc.jetstream()
        await publish(js, requested)
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
