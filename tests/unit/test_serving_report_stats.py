"""The report's pure parts: percentiles, the level summary against an SLO, the ratios against
each engine's `none`, and the methods (vLLM's with the flags `apply` renders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speccore.errors import SpecError
from speccore.models import engine_checkpoint
from specops.report import stats
from specops.report.launch import server_spec
from specops.report.loadgen import LevelRun, RequestRecord
from specops.report.methods import VLLM_CANDIDATES, parse_methods, vllm_methods
from specops.report.run import aggregate
from specops_schemas.catalog import Engine
from specops_schemas.engine_flags import engine_config
from specplatform.engines import VLLM, launcher


def test_percentile_interpolates_like_numpy() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.percentile([], 50) is None


def test_summary_goodput_counts_requests_within_the_slo() -> None:
    records = [
        RequestRecord(0.0, 0.5, 1.5, 11),  # TPOT 100 ms: good
        RequestRecord(0.0, 3.0, 4.0, 11),  # TTFT over 2 s
        RequestRecord(0.0, 0.5, 6.5, 11),  # TPOT 600 ms
        RequestRecord(0.0, 0.1, 0.1, 0, "APIError: boom"),
    ]
    s = stats.summarize(LevelRun(2, 10.0, records), stats.Slo(ttft_s=2.0, tpot_s=0.2))
    assert s["output_tokens"] == 33 and s["throughput_tok_s"] == pytest.approx(3.3)
    assert s["goodput_req_s"] == pytest.approx(0.1) and s["slo_attainment"] == 0.25
    assert s["errors"] == ["APIError: boom"]
    assert s["p50_tpot_ms"] == pytest.approx(100.0)


def test_aggregate_gives_ratios_against_the_engines_own_none_at_the_same_level() -> None:
    def row(method: str, tput: float, p99: float) -> dict:
        base = {name: None for name in ("acceptance_rate", "mean_acceptance_length")}
        nums = {
            "throughput_tok_s": tput, "goodput_req_s": 1.0, "slo_attainment": 1.0, "p50_ttft_ms": 1.0,
            "p99_ttft_ms": 2.0, "p50_tpot_ms": 1.0, "p99_tpot_ms": p99, "p50_e2e_ms": 1.0, "p99_e2e_ms": 2.0,
        }  # fmt: skip
        return {
            "method": method,
            "workload": "chat",
            "concurrency": 8,
            "requests": 4,
            "errors": [],
            **base,
            **nums,
        }

    rows = [row("none", 10.0, 50.0), row("ngram", 13.0, 60.0), row("ngram", 15.0, 80.0)]
    rows += [row("vllm:none", 5.0, 100.0), row("vllm:ngram-k4", 6.0, 90.0)]
    entries = {e["method"]: e for e in aggregate(rows)}
    ngram = entries["ngram"]
    assert ngram["reps"] == 2 and ngram["speedup"] == pytest.approx(1.4)
    assert ngram["p99_tpot_ms_vs_baseline"] == pytest.approx(1.4)
    vllm_ngram = entries["vllm:ngram-k4"]
    assert vllm_ngram["baseline"] == "vllm:none" and vllm_ngram["speedup"] == pytest.approx(1.2)
    assert vllm_ngram["p99_tpot_ms_vs_baseline"] == pytest.approx(0.9)
    assert entries["vllm:none"]["speedup"] == pytest.approx(1.0)


def test_methods_need_a_baseline() -> None:
    assert parse_methods("none=--method none;ng=--method ngram --k 4")["ng"] == [
        "--method",
        "ngram",
        "--k",
        "4",
    ]
    with pytest.raises(SpecError, match="none"):
        parse_methods("ng=--method ngram")
    with pytest.raises(SpecError, match="--vllm"):
        parse_methods("none=--method none;vllm:ng=--method ngram")


def test_vllm_methods_launch_the_flags_apply_renders_then_the_cpu_server_settings() -> None:
    methods = vllm_methods(VLLM.server_args)
    assert list(methods) == ["vllm:none", *(f"vllm:{c.candidate_id}" for c in VLLM_CANDIDATES)]
    assert "--speculative-config" not in methods["vllm:none"]
    for candidate in VLLM_CANDIDATES:
        flags = methods[f"vllm:{candidate.candidate_id}"]
        _, applied = engine_config(candidate, Engine.VLLM)
        assert flags[: len(applied)] == applied
        # The engine environment's settings, with the report's KV cache in place of theirs.
        settings = flags[len(applied) :]
        assert settings.count("--kv-cache-memory-bytes") == 1
        assert settings[settings.index("--kv-cache-memory-bytes") + 1] == str(2 * 1024**3)
        assert [a for a in VLLM.server_args if a not in settings] == [
            VLLM.server_args[VLLM.server_args.index("--kv-cache-memory-bytes") + 1]
        ]
    ngram = json.loads(methods["vllm:ngram-k4"][1])
    assert (ngram["prompt_lookup_min"], ngram["prompt_lookup_max"]) == (1, 4)


def test_a_vllm_method_runs_the_installed_vllm_on_the_checkpoint_under_the_report_model_name(
    tmp_path: Path,
) -> None:
    flags = vllm_methods(VLLM.server_args)["vllm:suffix-k16"]
    if launcher(VLLM.name) is None:
        with pytest.raises(SpecError, match="specops engines install vllm"):
            server_spec("vllm:suffix-k16", flags, "smollm2-135m-instruct", [], tmp_path)
        return
    spec = server_spec("vllm:suffix-k16", flags, "smollm2-135m-instruct", ["--threads", "2"], tmp_path)
    command = list(spec.command or [])
    assert command[: len(launcher(VLLM.name) or [])] == launcher(VLLM.name)
    assert command[command.index("serve") + 1] == engine_checkpoint("smollm2-135m-instruct")
    assert command[command.index("--served-model-name") + 1] == "smollm2-135m-instruct"
    assert command[-len(flags) :] == flags and "--threads" not in command  # speccore's flags stay speccore's
    assert spec.log == tmp_path / "vllm-suffix-k16.log"
