"""Issue 16's supervision acceptance on a whole `specops up` stack (tiny runs).

A service killed with SIGKILL is started again by the watcher. nats-server killed with
SIGKILL while a run is in flight: while no server is there, `specops status` says the
services cannot reach NATS and exits 1; `specops up` starts NATS again on the port the
services use, the in-flight run completes and a new run is processed. Killed once more
during that run, the watcher alone brings it back, and that run completes too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest
import torch
from fixtures.runtime import TINY, Runtime, started

from specops.cli import main as specops
from specops.client import SpeculativeClient
from specops.runtime.state import StateDir, terminate
from specops.runtime.supervisor import RuntimeStatus, status, up
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
RUN_TIMEOUT_S = 900.0
RESTART_TIMEOUT_S = 120.0


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = RESTART_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


def _pid(result: RuntimeStatus, name: str) -> int | None:
    for server in result.servers:
        if server.name == name and server.alive:
            return server.pid
    for proc in result.processes:
        if f"{proc.service}[{proc.replica}]" == name and proc.alive:
            return proc.pid
    return None


def _metrics_url(result: RuntimeStatus, name: str) -> str | None:
    return next(p.metrics_url for p in result.processes if f"{p.service}[{p.replica}]" == name)


def _client(runtime: Runtime, tenant: str) -> SpeculativeClient:
    # One tenant per run: a second tenant's identical request is no winner-cache hit.
    token = asyncio.run(issue_token(runtime.database_url, tenant_id=tenant, role=Role.DEVELOPER))
    return SpeculativeClient(runtime.url, token.secret)


def _settle(client: SpeculativeClient, run_id: str) -> str:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := client.runs.get(run_id).status) not in ("completed", "failed"):
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id} is still {state} after {RUN_TIMEOUT_S:g} s")
        time.sleep(0.5)
    return state


def _status_exit(monkeypatch: pytest.MonkeyPatch, runtime: Runtime) -> int:
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(runtime.settings.state_dir))
    return specops(["status"])


def test_killed_processes_come_back_and_runs_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    with started(monkeypatch, env=TINY) as runtime:
        settings = runtime.settings
        _wait_for(lambda: not status(settings).problems(), "every replica healthy after up", RUN_TIMEOUT_S)
        assert _status_exit(monkeypatch, runtime) == 0

        # A service killed: the watcher starts it again, with the same ops port.
        predictor = _pid(status(settings), "predictor[0]")
        metrics_url = _metrics_url(status(settings), "predictor[0]")
        assert predictor is not None and metrics_url is not None
        os.kill(predictor, signal.SIGKILL)
        _wait_for(
            lambda: _pid(status(settings), "predictor[0]") not in (None, predictor),
            "predictor[0] restarted by the watcher",
        )
        assert _metrics_url(status(settings), "predictor[0]") == metrics_url
        restarts = [r for r in status(settings).restarts if r.component == "predictor[0]"]
        assert restarts and restarts[-1].error is None
        assert "restarted predictor[0]" in (settings.state_dir / "logs" / "watch.log").read_text()

        with _client(runtime, "supervision-1") as first_client:
            first = first_client.runs.create(
                target=TARGET, workload="chat", mode="interactive", goal={"quality_gate": "topk5"}
            )
            _wait_for(
                lambda: first_client.runs.get(first.id).status not in ("queued",),
                "the first run under way",
                timeout_s=RUN_TIMEOUT_S,
            )

            # nats-server killed mid-run, the watcher stopped first so the outage lasts
            # until `up`: while it does, a live service that cannot reach NATS is not up.
            state_dir = StateDir(settings.state_dir)
            watcher = state_dir.load().watcher
            assert watcher is not None
            terminate(watcher, group=False)
            nats_url = runtime.nats_url
            nats = _pid(status(settings), "nats")
            assert nats is not None
            os.kill(nats, signal.SIGKILL)
            _wait_for(
                lambda: any(p.checks.get("nats") is False for p in status(settings).processes),
                "a replica reporting NATS unreachable",
            )
            assert _status_exit(monkeypatch, runtime) == 1

            result = up(settings)
            assert next(s.url for s in result.servers if s.name == "nats") == nats_url
            assert result.watcher is not None and result.watcher.alive
            assert _settle(first_client, first.id) == "completed"

        with _client(runtime, "supervision-2") as second_client:
            second = second_client.runs.create(
                target=TARGET, workload="code", mode="interactive", goal={"quality_gate": "topk5"}
            )
            assert second.cache_hit is False
            # Killed again mid-run, now with the watcher running: it restarts NATS on its own.
            nats = _pid(status(settings), "nats")
            assert nats is not None
            os.kill(nats, signal.SIGKILL)
            _wait_for(
                lambda: _pid(status(settings), "nats") not in (None, nats), "nats restarted by the watcher"
            )
            assert next(s.url for s in status(settings).servers if s.name == "nats") == nats_url
            assert _settle(second_client, second.id) == "completed"
        _wait_for(lambda: not status(settings).problems(), "every replica healthy again")
        assert _status_exit(monkeypatch, runtime) == 0
