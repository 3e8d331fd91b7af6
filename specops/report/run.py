"""The report's measurement: every method's server started once, then for each workload and
concurrency level the methods interleaved (the order rotated per repetition), each level
preceded by the server's spec-decode counters and followed by them again (acceptance = the
difference; benchmark_runner.engine_metrics reads vLLM's and speccore's alike).

Speeds are compared as ratios against the method's own engine's `none` measured in the same
run (methods.baseline_of); with repetitions, each number is the median over them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specops.report import stats
from specops.report.launch import engine_servers
from specops.report.loadgen import LoadPrompt, run_level
from specops.report.methods import baseline_of, engine_of
from specops_services.benchmark_runner import engine_metrics
from specprompts.sets import load_prompts
from specprompts.sources import humaneval_prompts, mtbench_prompts, sharegpt_prompts

log = logging.getLogger(__name__)

# Report workloads: the three public prompt sets by name, and specprompts' workloads
# (chat = ShareGPT with MT-Bench mixed in, code = HumanEval, and the derived ones).
_SOURCES = {"sharegpt": sharegpt_prompts, "mtbench": mtbench_prompts, "humaneval": humaneval_prompts}


@dataclass(frozen=True, slots=True)
class ReportSpec:
    model: str
    methods: dict[str, list[str]]  # label -> server flags; "none" is the baseline
    workloads: list[str]
    concurrency: list[int]
    n_prompts: int
    max_tokens: int
    reps: int
    slo: stats.Slo
    server_args: list[str] = field(default_factory=list)
    seed: int = 0
    rounds: int = 1

    def requests_at(self, concurrency: int) -> int:
        """Requests of one level: the prompt set, and at least `rounds` x the concurrency so the
        level runs at its concurrency for a while, not only while it fills and drains."""
        return max(self.n_prompts, self.rounds * concurrency)


def workload_prompts(workload: str, n: int, seed: int = 0) -> list[LoadPrompt]:
    source = _SOURCES.get(workload)
    prompts = source(n, seed) if source else load_prompts(workload, n, seed)
    return [LoadPrompt(p.text, p.chat) for p in prompts]


def measure(spec: ReportSpec, log_dir: Path) -> list[dict[str, Any]]:
    """One row per (workload, concurrency, rep, method): its summary and acceptance."""
    prompts = {w: workload_prompts(w, spec.n_prompts, spec.seed) for w in spec.workloads}
    rows: list[dict[str, Any]] = []
    with engine_servers(spec.methods, spec.model, spec.server_args, log_dir) as urls:
        for workload, ps in prompts.items():
            for url in urls.values():  # warm-up: the first requests of a prompt set pay one-off costs
                asyncio.run(run_level(url, spec.model, ps, concurrency=2, n_requests=2, max_tokens=8))
            for c in spec.concurrency:
                for rep in range(spec.reps):
                    labels = list(urls)
                    order = labels[rep % len(labels) :] + labels[: rep % len(labels)]
                    for label in order:
                        rows.append(_level(urls[label], label, workload, ps, c, rep, spec))
    return rows


def _level(
    url: str, label: str, workload: str, prompts: list[LoadPrompt], c: int, rep: int, spec: ReportSpec
) -> dict[str, Any]:
    prefix = engine_of(label).metrics_prefix
    before = _counts(url, prefix)
    run = asyncio.run(
        run_level(
            url,
            spec.model,
            prompts,
            concurrency=c,
            n_requests=spec.requests_at(c),
            max_tokens=spec.max_tokens,
        )
    )
    counters = engine_metrics.delta(before, _counts(url, prefix))
    summary = stats.summarize(run, spec.slo)
    log.info(
        "%s c=%d %s rep %d: %.1f tok/s, p99 TPOT %s ms",
        workload, c, label, rep, summary["throughput_tok_s"], _fmt(summary["p99_tpot_ms"]),
    )  # fmt: skip
    return {
        "method": label,
        "workload": workload,
        "concurrency": c,
        "rep": rep,
        **summary,
        "drafts": counters.drafts,
        "draft_tokens": counters.draft_tokens,
        "accepted_tokens": counters.accepted_tokens,
        "acceptance_rate": counters.acceptance_rate if counters.draft_tokens else None,
        "mean_acceptance_length": counters.mean_acceptance_length if counters.drafts else None,
        "records": [
            {"start_s": r.start_s, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s, "tokens": r.output_tokens}
            for r in run.records
        ],
    }


def _counts(url: str, prefix: str) -> engine_metrics.SpecCounts:
    response = httpx.get(f"{url}/metrics", timeout=30)
    response.raise_for_status()
    return engine_metrics.spec_counts(response.text, prefix)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


AGGREGATED = (
    "throughput_tok_s", "goodput_req_s", "slo_attainment", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
    "p99_tpot_ms", "p50_e2e_ms", "p99_e2e_ms", "acceptance_rate", "mean_acceptance_length",
)  # fmt: skip


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (workload, concurrency, method): the median over reps of each number, and
    throughput and p99s as ratios against its baseline's (its engine's `none`) at the same
    workload and concurrency."""
    keys = sorted({(r["workload"], r["concurrency"], r["method"]) for r in rows}, key=lambda k: (k[0], k[1]))
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    for key in keys:
        reps = [r for r in rows if (r["workload"], r["concurrency"], r["method"]) == key]
        entry: dict[str, Any] = {
            "workload": key[0],
            "concurrency": key[1],
            "method": key[2],
            "reps": len(reps),
        }
        for name in AGGREGATED:
            values = [r[name] for r in reps if r[name] is not None]
            entry[name] = stats.median(values)
        entry["errors"] = sum(len(r["errors"]) for r in reps)
        entry["requests"] = sum(r["requests"] for r in reps)
        entry["error_messages"] = sorted({m for r in reps for m in r["errors"]})[:3]
        out[key] = entry
    for (workload, c, method), entry in out.items():
        entry["baseline"] = baseline_of(method)
        base = out.get((workload, c, entry["baseline"]))
        if base is None:
            continue
        entry["speedup"] = stats.ratio(entry["throughput_tok_s"], base["throughput_tok_s"])
        for name in ("p99_ttft_ms", "p99_tpot_ms", "p99_e2e_ms"):
            entry[f"{name}_vs_baseline"] = stats.ratio(entry[name], base[name])
    return list(out.values())
