"""The benchmark-runner's HTTP engines without a model: launch commands, Prometheus deltas,
server processes that are missing, die or never answer, and the gate's verdict over HTTP.

The /metrics texts are written by prometheus_client, the exporter vLLM and the specops
engine server use, with vLLM's counter names and labels; the end-to-end bench on a real
`specops serve engine` is tests/integration/test_t1_http_engine.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from speccore.sampling import SamplingParams
from specops_schemas.api import Target
from specops_schemas.candidates import (
    Candidate,
    Measurement,
    MmluEvidence,
    StructuredEvidence,
    Top5Evidence,
)
from specops_schemas.catalog import Engine, Family, GateMethod
from specops_schemas.engine_flags import EngineCannotRun
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner import engine_metrics, gate_http
from specops_services.benchmark_runner.engine_server import (
    EngineServer,
    EngineStartError,
    HttpEngine,
    ServerSpec,
    launch_command,
)
from specops_services.benchmark_runner.measure_http import _sglang_estimate, http_engine, measure_http
from specops_services.benchmark_runner.protocol import MeasureError
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specops_services.quality_gate import logic as gate_logic
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import QualityGateSettings

NGRAM = Candidate(candidate_id="ngram-k4", family=Family.NGRAM, k=4)
MODEL = "smollm2-135m-instruct"


def _plan(engine: str, gate: str = "exact") -> BenchPlan:
    return BenchPlan(
        run_id="run-http",
        target=Target(model_ref=MODEL, gpu="cpu", engine=engine),
        fingerprint="chat",
        mode="interactive",
        quality_gate=gate,
        candidates=[NGRAM],
        reps=1,
        n_prompts=1,
        max_new_tokens=4,
    )


# --- launch commands ------------------------------------------------------------------------


def test_vllm_is_launched_with_the_flags_apply_renders() -> None:
    cmd = launch_command(HttpEngine.VLLM, ["vllm"], "meta-llama/Llama-3.1-8B", NGRAM, port=8123)
    assert cmd[:7] == ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--host", "127.0.0.1", "--port", "8123"]
    assert cmd[7] == "--speculative-config"
    assert json.loads(cmd[8])["method"] == "ngram" and json.loads(cmd[8])["num_speculative_tokens"] == 4
    baseline = launch_command(HttpEngine.VLLM, ["vllm"], "m", None, port=1, extra_args=["--seed", "0"])
    assert baseline == ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "1", "--seed", "0"]


def test_sglang_and_the_specops_server_commands() -> None:
    sglang = launch_command(
        HttpEngine.SGLANG, ["python", "-m", "sglang.launch_server"], "m", NGRAM, port=9000
    )
    assert sglang[:8] == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
    ]
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "NGRAM"
    specops = launch_command(HttpEngine.SPECOPS, ["specops"], MODEL, NGRAM, port=9001)
    assert specops == [
        "specops", "serve", "engine", "--model", MODEL, "--host", "127.0.0.1", "--port", "9001",
        "--method", "ngram", "--k", "4",
    ]  # fmt: skip
    assert launch_command(HttpEngine.SPECOPS, ["specops"], MODEL, None, port=1)[-2:] == ["--method", "none"]


def test_a_candidate_the_engine_refuses_is_not_launched() -> None:
    tree = Candidate(candidate_id="medusa-t", family=Family.MEDUSA, k=2, tree=[2, 1], draft="heads/medusa")
    with pytest.raises(EngineCannotRun, match="vLLM cannot run this candidate"):
        launch_command(HttpEngine.VLLM, ["vllm"], "m", tree, port=1)


def test_which_plans_go_over_http() -> None:
    inprocess = BenchmarkRunnerSettings()
    server = BenchmarkRunnerSettings(bench_speccore="server")
    assert http_engine(_plan("vllm"), inprocess) == HttpEngine.VLLM
    assert http_engine(_plan("sglang"), inprocess) == HttpEngine.SGLANG
    assert http_engine(_plan("speccore"), inprocess) is None
    assert http_engine(_plan("speccore"), server) == HttpEngine.SPECOPS
    assert HttpEngine.SPECOPS.catalog_engine == Engine.SPECCORE


# --- Prometheus ----------------------------------------------------------------------------


def _vllm_metrics(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
    """/metrics as vLLM's exporter writes it: counters (with _total and _created), labelled."""
    registry = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    for name, value in [
        ("vllm:spec_decode_num_drafts", drafts),
        ("vllm:spec_decode_num_draft_tokens", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", accepted),
    ]:
        Counter(name, "doc", list(labels), registry=registry).labels(**labels).inc(value)
    per = Counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "doc", [*labels, "position"], registry=registry
    )
    for pos, value in enumerate(per_pos):
        per.labels(**labels, position=str(pos)).inc(value)
    Counter("vllm:generation_tokens", "doc", list(labels), registry=registry).labels(**labels).inc(999)
    return generate_latest(registry).decode()


def test_spec_counts_and_their_delta_from_real_exposition_text() -> None:
    before = engine_metrics.spec_counts(_vllm_metrics(10, 40, 25, [9, 8, 5, 3]), "vllm:")
    after = engine_metrics.spec_counts(_vllm_metrics(30, 120, 70, [27, 20, 15, 8]), "vllm:")
    assert before == engine_metrics.SpecCounts(10, 40, 25, [9, 8, 5, 3])
    d = engine_metrics.delta(before, after)
    assert d == engine_metrics.SpecCounts(20, 80, 45, [18, 12, 10, 5])
    assert d.acceptance_rate == pytest.approx(45 / 80)
    assert d.mean_acceptance_length == pytest.approx(1 + 45 / 20)
    # Another prefix's counters, or none at all (speculation off), read zero.
    assert engine_metrics.spec_counts(_vllm_metrics(1, 4, 2, [1]), "specops:") == engine_metrics.SpecCounts()


def test_spec_counts_of_a_real_specops_server() -> None:
    """/metrics of `specops serve engine --method ngram --k 4` after four 16-token requests."""
    text = (Path(__file__).parent / "data" / "specops_serve_engine.metrics").read_text()
    counts = engine_metrics.spec_counts(text, "specops:")
    assert counts == engine_metrics.SpecCounts(18, 60, 16, [4, 4, 4, 4])
    assert engine_metrics.spec_counts(text, "vllm:") == engine_metrics.SpecCounts()


def test_a_counter_going_down_means_a_restart() -> None:
    with pytest.raises(ValueError, match="restarted"):
        engine_metrics.delta(
            engine_metrics.SpecCounts(5, 20, 10, [5]), engine_metrics.SpecCounts(1, 4, 2, [1])
        )


def test_sglang_gauges() -> None:
    registry = CollectorRegistry()
    Gauge("sglang:spec_accept_rate", "doc", ["model_name"], registry=registry).labels(model_name="m").set(0.5)
    Gauge("sglang:spec_accept_length", "doc", ["model_name"], registry=registry).labels(model_name="m").set(
        2.5
    )
    text = generate_latest(registry).decode()
    assert engine_metrics.gauges(text) == {"sglang:spec_accept_rate": 0.5, "sglang:spec_accept_length": 2.5}


def test_sglang_counts_are_estimated_from_its_gauges() -> None:
    gauges = {engine_metrics.SGLANG_LENGTH: 2.5, engine_metrics.SGLANG_RATE: 0.5}
    # 100 tokens at 2.5 a step: 40 steps, 60 accepted of 120 drafted.
    assert _sglang_estimate(gauges, 100) == engine_metrics.SpecCounts(40, 120, 60)
    assert _sglang_estimate({}, 100) is None  # speculation off: nothing drafted


# --- server processes ----------------------------------------------------------------------


def _spec(command: list[str], timeout_s: float = 60.0) -> ServerSpec:
    return ServerSpec(HttpEngine.VLLM, command, "http://127.0.0.1:9", timeout_s)


def test_a_missing_engine_is_named() -> None:
    with pytest.raises(EngineStartError, match="vllm is not installed here: 'no-such-vllm' not found"):
        EngineServer(_spec(["no-such-vllm", "serve", "m"])).start()


def test_a_server_that_dies_reports_its_log_tail() -> None:
    script = "import sys; print('CUDA out of memory', flush=True); sys.exit(3)"
    with pytest.raises(EngineStartError, match="exited with code 3 before it was ready: CUDA out of memory"):
        EngineServer(_spec([sys.executable, "-c", script])).start()


def test_a_server_that_never_answers_is_stopped_after_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    with pytest.raises(EngineStartError, match="was not ready after 1 s"):
        EngineServer(_spec([sys.executable, "-c", script], timeout_s=1.0)).start()
    assert not _running(int(pid_file.read_text()))


def test_a_runner_killed_with_sigkill_leaves_no_server(tmp_path: Path) -> None:
    """The kernel SIGTERMs a launched server when the process that launched it dies."""
    pid_file = tmp_path / "pid"
    server = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    runner = (
        "from specops_services.benchmark_runner.engine_server import EngineServer, HttpEngine, ServerSpec\n"
        f"command = [{sys.executable!r}, '-c', {server!r}]\n"
        "spec = ServerSpec(HttpEngine.VLLM, command, 'http://127.0.0.1:9', 600)\n"
        "EngineServer(spec).start()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the server never started"
            time.sleep(0.1)
        pid = int(pid_file.read_text())
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _running(pid):
        assert time.monotonic() < deadline, f"server {pid} outlived its runner"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_a_vllm_bench_without_vllm_fails_with_the_reason() -> None:
    settings = BenchmarkRunnerSettings(bench_vllm_command="no-such-vllm")
    with pytest.raises(
        MeasureError, match="baseline server did not start: vllm is not installed here"
    ) as err:
        measure_http(_plan("vllm"), HttpEngine.VLLM, settings, on_rep=lambda row: None)
    assert err.value.error_stage == "benchmark"


# --- the gate ------------------------------------------------------------------------------


def test_the_exact_gate_over_http_loads_nothing(tmp_path: Path) -> None:
    runner = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path))
    passed = gate_logic.exact_over_http(NGRAM, 1.0, 1.0)
    assert passed.passed is True and passed.details["measured_over"] == "http"
    summary = _summary(greedy_agreement=0.5)
    verdict = runner.evaluate(_plan("vllm"), NGRAM, measured=summary)
    assert verdict.method == GateMethod.EXACT and verdict.passed is False and verdict.score == 0.5
    closed = runner.evaluate(_plan("vllm", gate="topk5"), NGRAM, measured=summary)
    assert closed.passed is False and "did not report" in str(closed.details["error"])
    assert len(runner.models) == 0


def test_the_topk5_gate_over_http_judges_what_the_bench_scored(tmp_path: Path) -> None:
    """Greedy, a lossless candidate's tokens are all inside; one token in ten outside fails 0.95."""
    runner = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path))
    plan = _plan("vllm", gate="topk5")
    lossless = Top5Evidence(
        prompts=4, tokens=40, inside_top5=40, expected_inside_top5=40.0, worst_prompt_share=1
    )
    lossy = Top5Evidence(
        prompts=4, tokens=40, inside_top5=36, expected_inside_top5=40.0, worst_prompt_share=0.6
    )
    passed = runner.evaluate(plan, NGRAM, measured=_summary(None).model_copy(update={"top5": lossless}))
    failed = runner.evaluate(plan, NGRAM, measured=_summary(None).model_copy(update={"top5": lossy}))
    assert passed.method == GateMethod.TOPK5 and passed.passed is True and passed.score == 1.0
    assert (
        failed.passed is False and failed.score == pytest.approx(0.9) and failed.details["outside_top5"] == 4
    )
    assert len(runner.models) == 0


def test_mmlu_and_constraint_gates_over_http_judge_the_servers_answers(tmp_path: Path) -> None:
    """A candidate whose server answered every MMLU question as the baseline's did passes;
    one that answered a correct one wrongly fails with the drop. Schema violations above the
    baseline's rate fail constraint_violation, naming the task; logit_kl fails closed."""
    runner = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path))
    ids, truth, base = ["mmlu:1", "mmlu:2", "mmlu:3", "mmlu:4"], [0, 1, 2, 3], [0, 1, None, 2]

    def mmlu(candidate_answers: list[int | None]) -> Measurement:
        evidence = MmluEvidence(
            seed=0, question_ids=ids, truth=truth, baseline_answers=base, candidate_answers=candidate_answers
        )
        return _summary(None).model_copy(update={"mmlu": evidence})

    plan = _plan("vllm", gate="mmlu_slice")
    same = runner.evaluate(plan, NGRAM, measured=mmlu(list(base)))
    worse = runner.evaluate(plan, NGRAM, measured=mmlu([3, 1, None, 2]))
    assert same.method == GateMethod.MMLU_SLICE and same.passed is True and same.score == 0.0
    assert same.details["measured_over"] == "http" and same.details["baseline_accuracy"] == 0.5
    assert worse.passed is False and worse.score == pytest.approx(0.25)
    assert worse.details["first_changed"] == "mmlu:1" and worse.details["changed_answers"] == 1

    def structured(candidate_violations: list[int], problems: list[str | None]) -> Measurement:
        evidence = StructuredEvidence(
            task_ids=["structured:a", "structured:b"],
            baseline_violations=[1, 0],
            candidate_violations=candidate_violations,
            candidate_problems=problems,
            baseline_tokens=200,
            candidate_tokens=200,
        )
        return _summary(None).model_copy(update={"structured": evidence})

    plan = _plan("vllm", gate="constraint_violation")
    same = runner.evaluate(plan, NGRAM, measured=structured([1, 0], ["not one JSON value", None]))
    broke = runner.evaluate(plan, NGRAM, measured=structured([1, 2], [None, "'name' is a required property"]))
    assert same.passed is True and same.score == 0.0 and same.details["measured_over"] == "http"
    assert broke.passed is False and broke.score == pytest.approx(10.0)  # 2 more per 200 tokens
    assert broke.details["worst_task"] == {
        "task_id": "structured:b",
        "extra_violations": 2,
        "problem": "'name' is a required property",
    }

    closed = runner.evaluate(_plan("vllm", gate="logit_kl"), NGRAM, measured=_summary(None))
    assert closed.passed is False and "whole distribution" in str(closed.details["error"])
    assert len(runner.models) == 0


def test_top5_scoring_of_the_baselines_prompt_logprobs() -> None:
    """Ranks come from the baseline's report at each output position; sampled, the expected
    share is the top 5's mass under the plan's temperature and nucleus."""
    entry = {
        str(t): {"logprob": math.log(p), "rank": r}
        for r, (t, p) in enumerate(
            [(11, 0.5), (12, 0.2), (13, 0.1), (14, 0.1), (15, 0.05), (16, 0.05)], start=1
        )
    }
    scored = gate_http.score_positions([entry, entry], [11, 16], SamplingParams())
    assert scored.ranks == [1, 6] and scored.top5_mass == [1.0, 1.0]
    evidence = gate_http.top5_evidence([scored])
    assert (evidence.tokens, evidence.inside_top5, evidence.worst_prompt_share) == (2, 1, 0.5)
    probs = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]
    assert gate_http.top5_mass([math.log(p) for p in probs], SamplingParams(1.0)) == pytest.approx(0.95)
    # top_p 0.75 keeps the first three tokens (0.8 of the mass), all inside the top 5.
    assert gate_http.top5_mass([math.log(p) for p in probs], SamplingParams(1.0, top_p=0.75)) == 1.0


def _summary(greedy_agreement: float | None) -> Measurement:
    return Measurement(
        candidate_id=NGRAM.candidate_id,
        reps=1,
        tokens_per_s=10.0,
        tokens_per_s_stdev=0.0,
        speedup=1.2,
        acceptance_rate=0.5,
        mean_acceptance_length=2.0,
        per_position_acceptance=[0.5],
        ttft_s=0.1,
        tpot_s=0.05,
        extra_memory_bytes=0,
        greedy_agreement=greedy_agreement,
    )
