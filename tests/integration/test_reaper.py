"""A whole `specops up` stack with no benchmark-runner: the gateway's reaper fails the run that
waits for one, with its stage and what to check, and the run's SSE stream ends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from fixtures.runtime import TINY, Runtime, started
from httpx_sse import EventSource

from specops.runtime.supervisor import SERVICES
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token

pytestmark = pytest.mark.slow

REQUEST = {
    "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
    "workload": {"fingerprint": "chat"},
    "goal": {"quality_gate": "topk5"},
}
# The benchmarking deadline is short: no runner will ever take the bench.
REAPER = {"SPECOPS_STAGE_DEADLINE_BENCHMARKING_S": "5", "SPECOPS_REAPER_INTERVAL_S": "0.5"}
STREAM_TIMEOUT_S = 300.0


def _specops(runtime: Runtime, *args: str) -> str:
    env = os.environ | {"SPECOPS_STATE_DIR": str(runtime.settings.state_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "specops.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_run_no_benchmark_runner_takes_is_failed_by_the_reaper(monkeypatch: pytest.MonkeyPatch) -> None:
    replicas = dict.fromkeys(SERVICES, 1) | {"benchmark-runner": 0}
    with started(monkeypatch, replicas=replicas, env=TINY | REAPER) as runtime:
        issued = asyncio.run(issue_token(runtime.database_url, tenant_id="reaped", role=Role.DEVELOPER))
        auth = {"Authorization": f"Bearer {issued.secret}"}
        with httpx.Client(base_url=runtime.url, headers=auth, timeout=STREAM_TIMEOUT_S) as client:
            created = client.post(f"{API_PREFIX}/runs", json=REQUEST)
            assert created.status_code == 202, created.text
            run_id = created.json()["id"]
            # The stream ends with the run's run.failed (the client would wait forever otherwise).
            stream = client.get(f"{API_PREFIX}/runs/{run_id}/events")
            run = client.get(f"{API_PREFIX}/runs/{run_id}").json()
        letters = _specops(runtime, "dlq", "ls")
        gateway_log = runtime.log("gateway")

    events = [m.event for m in EventSource(stream).iter_sse() if m.data]
    assert events[-1] == "run.failed" and events.count("run.failed") == 1
    assert "bench.requested" in events and "bench.completed" not in events
    assert run["status"] == "failed"
    assert run["error"]["error_stage"] == "benchmark"
    assert run["error"]["message"].startswith("no progress in benchmarking for ")
    assert "is a benchmark-runner running? see `specops status`" in run["error"]["message"]
    assert f"run {run_id} failed: no progress in benchmarking" in gateway_log
    # Nothing was parked on the way: the admin's `dlq ls` reads the stream and finds no letter.
    assert letters.strip() == "no dead letters"
