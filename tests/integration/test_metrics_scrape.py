"""Issue 16's metrics acceptance: after a run through every service, as `specops up` starts
them, each service's `/metrics` (its ops port, recorded in the runtime state) shows it: the
predictor consumed `spec.run.*.requested`, the gateway counted the HTTP requests and holds a
completed run in its runs-by-state gauge."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch
from fixtures.runtime import TINY, Runtime, started
from prometheus_client.parser import text_string_to_metric_families

from specops.client import SpeculativeClient
from specops.runtime.state import StateDir
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    # On a CUDA host the `cpu` profile is predicted, not measured: the run takes another path.
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
RUN_TIMEOUT_S = 600.0
SCRAPE_WAIT_S = 60.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(runtime: Runtime, service: str) -> Samples:
    """Every sample of `service`'s first replica's /metrics, by name and labels."""
    state = StateDir(runtime.settings.state_dir).load()
    [record] = [r for r in state.services if r.service == service and r.replica == 0]
    assert record.metrics_port is not None, f"{service} has no ops port in the runtime state"
    text = httpx.get(f"http://127.0.0.1:{record.metrics_port}/metrics", timeout=10.0).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_after_a_run_each_services_metrics_show_it(monkeypatch: pytest.MonkeyPatch) -> None:
    env = TINY | {"SPECOPS_GATEWAY_METRICS_REFRESH_S": "0.5"}
    with started(monkeypatch, env=env) as runtime:
        token = asyncio.run(issue_token(runtime.database_url, tenant_id="metrics", role=Role.DEVELOPER))
        with SpeculativeClient(runtime.url, token.secret) as client:
            run = client.runs.create(target=TARGET, workload="chat")
            assert client.runs.wait(run.id, timeout=RUN_TIMEOUT_S).status == "completed"

        predictor = _scrape(runtime, "predictor")
        requested = {"consumer": "predictor-plan", "subject": "spec.run.*.requested"}
        assert _value(predictor, "specops_bus_messages_consumed_total", **requested) >= 1
        assert _value(predictor, "specops_bus_handler_duration_seconds_count", **requested) >= 1
        assert ("specops_outbox_pending_rows", frozenset({("producer", "predictor")})) in predictor

        # The runs are recounted every 0.5 s: the completed run shows within a few scrapes.
        deadline = time.monotonic() + SCRAPE_WAIT_S
        while _value(gateway := _scrape(runtime, "gateway"), "specops_runs_by_state", state="completed") < 1:
            assert time.monotonic() < deadline, "the gateway's runs_by_state never showed the completed run"
            time.sleep(0.5)
        runs = f"{API_PREFIX}/runs"
        assert _value(gateway, "specops_http_requests_total", method="POST", route=runs, status="202") >= 1
        assert (
            _value(
                gateway, "specops_http_requests_total", method="GET", route=f"{runs}/{{run_id}}", status="200"
            )
            >= 1
        )
