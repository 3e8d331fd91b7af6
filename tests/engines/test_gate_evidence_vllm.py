"""The gate's `mmlu_slice` and `constraint_violation` evidence gathered on real vLLM servers.

Two servers of vLLM's CPU build (the environment `make setup` installs): the baseline,
and ngram with the flags `apply` renders. A bench of each gate method attaches to them
(SPECOPS_BENCH_ENGINE_URLS), so the evidence goes through the whole measuring protocol
into the candidate's Measurement, and the quality gate judges it as it judges
in-process: greedy speculation is lossless, so the candidate answers every MMLU
question and writes every JSON reply as the baseline does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from speccore.models import engine_checkpoint
from specops_schemas.api import Target
from specops_schemas.candidates import BASELINE_ID, Candidate, Measurement
from specops_schemas.catalog import Family, GateMethod
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.engine_server import (
    HOST,
    EngineServer,
    HttpEngine,
    ServerSpec,
    free_port,
    launch_args,
    server_command,
)
from specops_services.benchmark_runner.measure_http import MMLU_QUESTIONS, measure_http
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import QualityGateSettings
from specplatform import engines

VLLM = engines.state("vllm")
pytestmark = [
    pytest.mark.slow,
    # Two vLLM starts and both benches: about 4 minutes here, beyond make test's budget.
    pytest.mark.long,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
    pytest.mark.skipif(not VLLM.runnable, reason=f"{VLLM.reason}; `{VLLM.install_command}` installs it"),
]

MODEL = "smollm2-135m-instruct"
NGRAM = Candidate(candidate_id="ngram-k4", family=Family.NGRAM, k=4)


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    settings = BenchmarkRunnerSettings()
    logs = tmp_path_factory.mktemp("vllm")
    servers: dict[str, EngineServer] = {}
    try:
        for key, candidate in ((BASELINE_ID, None), (NGRAM.candidate_id, NGRAM)):
            port = free_port()
            command = [
                *server_command(
                    HttpEngine.VLLM, settings.engine_command("vllm"), engine_checkpoint(MODEL), port
                ),
                *launch_args(HttpEngine.VLLM, candidate, extra_args=settings.engine_args("vllm")),
            ]
            spec = ServerSpec(
                HttpEngine.VLLM, command, f"http://{HOST}:{port}", 900.0, log=logs / f"{key}.log"
            )
            servers[key] = EngineServer(spec)
            servers[key].start()
        yield {key: server.url for key, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


def _bench(gate: GateMethod, urls: dict[str, str]) -> tuple[BenchPlan, Measurement]:
    plan = BenchPlan(
        run_id=f"gate-{gate}",
        target=Target(model_ref=MODEL, gpu="cpu", engine="vllm"),
        fingerprint="chat",
        mode="interactive",
        quality_gate=gate,
        candidates=[NGRAM],
        reps=1,
        n_prompts=1,
        max_new_tokens=8,
    )
    settings = BenchmarkRunnerSettings(bench_engine_urls=urls)
    outcome = measure_http(plan, HttpEngine.VLLM, settings, on_rep=lambda row: None)
    assert not outcome.failures, outcome.failures
    [measured] = outcome.results
    return plan, measured


def test_mmlu_answers_of_both_servers_are_judged_by_the_gate(urls: dict[str, str], tmp_path: Path) -> None:
    plan, measured = _bench(GateMethod.MMLU_SLICE, urls)
    evidence = measured.mmlu
    assert evidence is not None and len(evidence.question_ids) == MMLU_QUESTIONS
    # The answers were read off the replies (the model names a letter for most questions).
    assert sum(a is not None for a in evidence.baseline_answers) >= MMLU_QUESTIONS // 2
    assert evidence.candidate_answers == evidence.baseline_answers
    verdict = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path)).evaluate(
        plan, NGRAM, measured=measured
    )
    assert verdict.method == GateMethod.MMLU_SLICE and verdict.passed is True and verdict.score == 0.0
    assert verdict.details["measured_over"] == "http" and verdict.details["changed_answers"] == 0


def test_json_replies_of_both_servers_are_judged_by_the_gate(urls: dict[str, str], tmp_path: Path) -> None:
    plan, measured = _bench(GateMethod.CONSTRAINT_VIOLATION, urls)
    evidence = measured.structured
    assert evidence is not None and evidence.candidate_tokens > 0
    assert evidence.candidate_violations == evidence.baseline_violations
    assert evidence.candidate_tokens == evidence.baseline_tokens
    verdict = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path)).evaluate(
        plan, NGRAM, measured=measured
    )
    assert verdict.method == GateMethod.CONSTRAINT_VIOLATION and verdict.passed is True
    assert verdict.score == 0.0 and verdict.details["measured_over"] == "http"
