"""A bench over HTTP on real `specops serve engine` servers, without the bus, in batch mode
(concurrent requests): every method on its own server, acceptance from the servers'
/metrics, greedy outputs compared for the exact gate, a candidate whose server cannot
start failed alone with the server's own words, and no server left running afterwards."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from specops_schemas.api import Target
from specops_schemas.candidates import BASELINE_ID, Candidate
from specops_schemas.catalog import Family
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.engine_server import HttpEngine
from specops_services.benchmark_runner.measure_http import measure_http
from specops_services.benchmark_runner.protocol import RepRow
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings

pytestmark = pytest.mark.slow

NGRAM = Candidate(candidate_id="ngram-k3", family=Family.NGRAM, k=3)
BROKEN = Candidate(candidate_id="medusa-missing", family=Family.MEDUSA, k=2, draft="/nonexistent/medusa-head")


def test_a_bench_on_engine_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"SPECOPS_TEST_BENCH={uuid.uuid4()}"
    monkeypatch.setenv(*marker.split("="))  # inherited by the servers: how they are found below
    plan = BenchPlan(
        run_id="run-http-bench",
        target=Target(model_ref="smollm2-135m-instruct", gpu="cpu", engine="speccore"),
        fingerprint="code",
        mode="batch",  # both prompts sent at once (the interactive path: tests/integration)
        quality_gate="exact",
        candidates=[NGRAM, BROKEN],
        reps=1,
        n_prompts=2,
        max_new_tokens=12,
    )
    settings = BenchmarkRunnerSettings(bench_speccore="server", bench_device="cpu", threads=1)
    rows: list[RepRow] = []
    result = measure_http(plan, HttpEngine.SPECOPS, settings, on_rep=rows.append)
    assert _processes_with(marker) == [], "a server outlived its bench"

    assert [r.candidate_id for r in rows] == [BASELINE_ID, NGRAM.candidate_id]
    assert [f.candidate_id for f in result.failures] == [BROKEN.candidate_id]
    failure = result.failures[0]
    assert failure.error_stage == "model_load" and "server did not start" in failure.message
    assert "nonexistent" in failure.message  # the server's own error, from its log's tail
    (ngram,) = result.results
    assert ngram.greedy_agreement == 1.0
    counts = rows[1].metrics
    assert counts.new_tokens > 0 and counts.verify_steps > 0 and counts.drafted_tokens > 0
    assert len(counts.per_position_acceptance) == NGRAM.k
    assert ngram.acceptance_rate == pytest.approx(counts.accepted_tokens / counts.drafted_tokens)
    assert result.baseline.acceptance_rate == 0.0 and rows[0].metrics.drafted_tokens == 0


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            mine = proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes()
            if mine and "zombie" not in (proc / "status").read_text():
                found.append(int(proc.name))
        except OSError:
            continue
    return found
