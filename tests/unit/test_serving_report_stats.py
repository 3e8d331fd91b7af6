"""The report's pure parts: percentiles, the level summary against an SLO, the spec-decode
counter deltas parsed from a Prometheus exposition, and the ratios against `none`."""

from __future__ import annotations

import pytest

from speccore.errors import SpecError
from specops.commands.report import parse_methods
from specops.report import stats
from specops.report.loadgen import LevelRun, RequestRecord
from specops.report.metrics import parse_counters
from specops.report.run import aggregate


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


def test_counters_are_summed_over_labels() -> None:
    text = "\n".join([
        "# TYPE specops:spec_decode_num_drafts counter",
        'specops:spec_decode_num_drafts_total{model_name="m"} 10.0',
        "# TYPE specops:spec_decode_num_draft_tokens counter",
        'specops:spec_decode_num_draft_tokens_total{model_name="m"} 40.0',
        "# TYPE specops:spec_decode_num_accepted_tokens counter",
        'specops:spec_decode_num_accepted_tokens_total{model_name="m"} 20.0',
        "# TYPE specops:spec_decode_num_accepted_tokens_per_pos counter",
        'specops:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9.0',
    ])  # fmt: skip
    c = parse_counters(text + "\n")
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (10.0, 40.0, 20.0)
    assert c.acceptance_rate == 0.5 and c.mean_acceptance_length == 3.0


def test_aggregate_gives_ratios_against_none_at_the_same_level() -> None:
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

    entries = aggregate([row("none", 10.0, 50.0), row("ngram", 13.0, 60.0), row("ngram", 15.0, 80.0)])
    ngram = next(e for e in entries if e["method"] == "ngram")
    assert ngram["reps"] == 2 and ngram["speedup"] == pytest.approx(1.4)
    assert ngram["p99_tpot_ms_vs_none"] == pytest.approx(1.4)


def test_methods_need_a_baseline() -> None:
    assert parse_methods("none=--method none;ng=--method ngram --k 4")["ng"] == [
        "--method",
        "ngram",
        "--k",
        "4",
    ]
    with pytest.raises(SpecError, match="none"):
        parse_methods("ng=--method ngram")
