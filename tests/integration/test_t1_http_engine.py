"""Issue 19's acceptance test for HTTP engines: a T1 run measured on `specops serve engine`.

The runtime as `specops up` starts it (real embedded NATS and PostgreSQL, every service
its own process), with the benchmark-runner measuring speccore over HTTP
(SPECOPS_BENCH_SPECCORE=server): it launches one engine server for the baseline and one
per candidate, drives them with the OpenAI client, reads acceptance from their /metrics,
and compares their greedy outputs; the quality gate's `exact` verdicts come from that
comparison. The same protocol measures vLLM and SGLang on a host that has them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch
from fixtures.runtime import TINY, Runtime, started

from specops.client import SpeculativeClient
from specops_schemas.candidates import BASELINE_ID
from specops_schemas.catalog import Role
from specops_schemas.events import BenchRepMeasured, GateEvaluated, RunCompleted
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
HTTP = TINY | {"SPECOPS_BENCH_SPECCORE": "server", "SPECOPS_BENCH_NEW_TOKENS": "16"}


def test_t1_run_measured_on_the_engine_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with started(monkeypatch, env=HTTP) as runtime:
        completed, reps, gates = _run(runtime)
        runner_log = runtime.log("benchmark-runner")
        assert "starting the specops server of baseline" in runner_log
        assert _engine_servers(runtime.settings.state_dir) == [], "engine servers left running"

    assert completed.measured is True
    baseline = [r for r in reps if r.candidate_id == BASELINE_ID]
    measured = [r for r in reps if r.candidate_id != BASELINE_ID]
    assert len(baseline) == 1 and measured
    # Over HTTP, the rows carry what the client and /metrics saw: no in-process draft or verify time.
    assert all(r.metrics.draft_time_s == 0.0 == r.metrics.verify_time_s for r in reps)
    assert all(r.metrics.new_tokens > 0 and r.metrics.prompt_tokens > 0 for r in reps)
    assert baseline[0].metrics.drafted_tokens == 0
    assert any(r.metrics.drafted_tokens > 0 for r in measured), "no spec-decode counts from /metrics"
    for r in measured:
        m = r.metrics
        assert m.acceptance_rate == pytest.approx(
            m.accepted_tokens / m.drafted_tokens if m.drafted_tokens else 0
        )

    assert {g.candidate_id for g in gates} == {r.candidate_id for r in measured}
    for gate in gates:
        assert gate.method == "exact" and gate.details["measured_over"] == "http"
        assert gate.passed is True, gate  # speccore is lossless: greedy outputs equal the baseline's
    rows = {c.candidate.candidate_id: c for c in completed.candidates}
    for gate in gates:
        assert rows[gate.candidate_id].measurement is not None
        assert rows[gate.candidate_id].measurement.greedy_agreement == 1.0
    if completed.winner is not None:  # a winner needs a measured speedup over 1, which timing decides
        assert completed.winner.measurement is not None and completed.winner.gate is not None
        assert completed.winner.gate.passed is True
    print(f"winner: {completed.winner.candidate.candidate_id if completed.winner else None}")


def _run(runtime: Runtime) -> tuple[RunCompleted, list[BenchRepMeasured], list[GateEvaluated]]:
    token = asyncio.run(issue_token(runtime.database_url, tenant_id="t1-http", role=Role.DEVELOPER))
    with SpeculativeClient(runtime.url, token.secret) as client:
        run = client.runs.create(
            target=TARGET, workload="chat", mode="interactive", goal={"quality_gate": "exact"}
        )
        events = [event.payload for event in client.runs.stream(run.id)]
    assert isinstance(events[-1], RunCompleted), [type(e).__name__ for e in events]
    reps = [e for e in events if isinstance(e, BenchRepMeasured)]
    gates = [e for e in events if isinstance(e, GateEvaluated)]
    return events[-1], reps, gates


def _engine_servers(state_dir: Path) -> list[int]:
    """Engine servers (`serve engine`) started under this runtime's environment that still run."""
    found = []
    deadline = time.monotonic() + 30.0
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if b"serve\0engine\0" in cmdline and str(state_dir).encode() in environ:
                found.append(int(proc.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
