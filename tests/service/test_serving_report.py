"""`specops report` end to end at a tiny size on real `specops serve engine` servers (the
baseline and n-gram): every level measured, the JSON, markdown and plots written with the
report's fields, and no server left running. No timing thresholds: only what was written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.cli import main

# make test-full runs it, make test does not (make report is the report itself).
pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_the_report_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = [
        "report", "--workloads", "sharegpt,humaneval", "--concurrency", "1,2", "--n-prompts", "2",
        "--max-tokens", "8", "--rounds", "2", "--methods", "none=--method none;ngram=--method ngram --k 3",
        "--threads", "1", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0

    report = json.loads(out.with_suffix(".json").read_text())
    assert report["spec"]["concurrency"] == [1, 2]
    assert set(report["spec"]["methods"]) == {"none", "ngram"}
    entries = {(e["workload"], e["concurrency"], e["method"]): e for e in report["entries"]}
    assert set(entries) == {
        (w, c, m) for w in ("sharegpt", "humaneval") for c in (1, 2) for m in ("none", "ngram")
    }
    for (_, _, method), e in entries.items():
        assert e["errors"] == 0
        assert e["throughput_tok_s"] > 0
        for name in ("p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_e2e_ms", "p99_e2e_ms"):
            assert e[name] is not None and e[name] > 0, name
        assert 0 <= e["slo_attainment"] <= 1 and e["goodput_req_s"] >= 0
        assert e["speedup"] is not None and e["p99_tpot_ms_vs_baseline"] is not None
        if method == "none":
            assert e["acceptance_rate"] is None  # plain decoding drafts nothing
        else:
            assert e["mean_acceptance_length"] is not None and e["mean_acceptance_length"] >= 1
    rows = report["rows"]
    # max(prompts, rounds x concurrency) requests per level
    assert {len(r["records"]) for r in rows if r["concurrency"] == 2} == {4}
    assert all(r["tokens"] > 0 for row in rows for r in row["records"])

    md = out.with_suffix(".md").read_text()
    for heading in (
        "## sharegpt",
        "## humaneval",
        "## Acceptance per distribution",
        "## Cost per 1M output tokens",
    ):
        assert heading in md
    assert report["command"] in md
    for path in report["plots"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({Path(path).name})" in md
    logs = list((tmp_path / "report-logs").glob("*.log"))
    assert {p.stem for p in logs} == {"none", "ngram"}
    assert all("the engine worker stopped" in p.read_text() for p in logs)
