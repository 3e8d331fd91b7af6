"""T1 latency against a running stack (`specops up`): how soon a run answers.

- a cache miss: POST runs -> `run.predicted` on the run's event stream, criterion < 5 s;
- a cache hit:  POST runs -> completed (the POST answers `completed`, `cache_hit=true`),
  criterion < 1 s; also POST -> `run.completed` read back over the event stream.

The winner cache is per tenant, so each miss sample runs under a fresh tenant whose
token this script issues straight into the stack's database (it needs the
DATABASE_URL of `specops up`, found the usual way). Two targets:

- `predicted`: smollm2-135m-instruct / cpu / vllm. vLLM cannot run here, so the
  answer is the prediction alone; misses cost the machine nothing, so --n of them.
- `measured`: smollm2-135m-instruct / cpu / speccore. The predictor also plans a bench,
  which runs for minutes on a CPU; --measured-runs of them (default 1) are waited for,
  one at a time, so no bench overlaps the next sample.

After each miss completes, --n identical requests measure the hit. Times are taken
by the client (wall clock around the HTTP calls) and, for `run.predicted`, also by the
server (the event's occurred_at minus the run's created_at).

    .venv/bin/python bench/t1_latency.py --n 5 --out bench/results/t1-latency-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import fresh_token, machine

from specops.client import Run, SpeculativeClient, default_url
from specops_schemas.events import RunPredicted
from specplatform.settings import load_settings

PREDICTED_LIMIT_S = 5.0
CACHE_HIT_LIMIT_S = 1.0
MODEL = "smollm2-135m-instruct"
TARGETS = {
    "predicted": {"model_ref": MODEL, "gpu": "cpu", "engine": "vllm"},
    "measured": {"model_ref": MODEL, "gpu": "cpu", "engine": "speccore"},
}
WORKLOAD = "chat"
RUN_TIMEOUT_S = 1800.0


@dataclass
class Samples:
    """Seconds per metric, by scenario."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, scenario: str, metric: str, seconds: float) -> None:
        self.values.setdefault((scenario, metric), []).append(seconds)


METRICS = {
    "post_to_predicted_s": ("POST -> run.predicted (miss, client)", PREDICTED_LIMIT_S),
    "server_created_to_predicted_s": ("created -> run.predicted (miss, server)", PREDICTED_LIMIT_S),
    "miss_post_to_completed_s": ("POST -> run.completed (miss)", None),
    "hit_post_to_completed_s": ("POST -> completed (hit, on the POST)", CACHE_HIT_LIMIT_S),
    "hit_post_to_sse_completed_s": ("POST -> run.completed (hit, via SSE)", CACHE_HIT_LIMIT_S),
}


def miss(client: SpeculativeClient, scenario: str, samples: Samples) -> Run:
    """One cache-miss run, followed to its end; records when `run.predicted` came."""
    start = time.monotonic()
    run = client.runs.create(target=TARGETS[scenario], workload=WORKLOAD)
    if run.cache_hit:
        raise SystemExit(f"t1_latency: a fresh tenant's first {scenario} run was a cache hit")
    for event in client.runs.stream(run.id):
        if isinstance(event.payload, RunPredicted) and event.envelope is not None:
            samples.add(scenario, "post_to_predicted_s", time.monotonic() - start)
            server = (event.envelope.occurred_at - run.created_at).total_seconds()
            samples.add(scenario, "server_created_to_predicted_s", server)
        if time.monotonic() - start > RUN_TIMEOUT_S:
            raise SystemExit(f"t1_latency: run {run.id} did not finish within {RUN_TIMEOUT_S:g} s")
    samples.add(scenario, "miss_post_to_completed_s", time.monotonic() - start)
    final = client.runs.get(run.id)
    if final.status != "completed":
        raise SystemExit(f"t1_latency: run {run.id} {final.status}: {final.error}")
    return final


def hits(client: SpeculativeClient, scenario: str, n: int, samples: Samples) -> None:
    for _ in range(n):
        start = time.monotonic()
        run = client.runs.create(target=TARGETS[scenario], workload=WORKLOAD)
        answered = time.monotonic() - start
        if not (run.cache_hit and run.status == "completed"):
            raise SystemExit(
                f"t1_latency: the repeated {scenario} request was not a cache hit ({run.status})"
            )
        samples.add(scenario, "hit_post_to_completed_s", answered)
        for event in client.runs.stream(run.id):
            if event.type == "run.completed":
                samples.add(scenario, "hit_post_to_sse_completed_s", time.monotonic() - start)


def summarise(samples: Samples) -> list[dict[str, Any]]:
    rows = []
    order = {name: i for i, name in enumerate(METRICS)}
    for (scenario, metric), values in sorted(samples.values.items(), key=lambda kv: order[kv[0][1]]):
        label, limit = METRICS[metric]
        rows.append(
            {
                "scenario": scenario,
                "metric": metric,
                "label": label,
                "n": len(values),
                "median_s": statistics.median(values),
                "max_s": max(values),
                "limit_s": limit,
                "pass": None if limit is None else max(values) < limit,
                "values_s": values,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'scenario':<10} {'metric':<40} {'n':>3} {'median':>8} {'max':>8}  criterion"]
    for r in rows:
        verdict = "" if r["limit_s"] is None else f"< {r['limit_s']:g} s: {'pass' if r['pass'] else 'FAIL'}"
        lines.append(
            f"{r['scenario']:<10} {r['label']:<40} {r['n']:>3} "
            f"{r['median_s']:>7.3f}s {r['max_s']:>7.3f}s  {verdict}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=5, help="predicted-only misses, and hits after each miss")
    parser.add_argument(
        "--measured-runs", type=int, default=1, help="speccore misses (each benches for minutes)"
    )
    parser.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    parser.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    parser.add_argument("--out", type=Path, default=Path("bench/results/t1-latency-cpu.json"))
    args = parser.parse_args()

    dsn = args.database_url or load_settings().require_database_url()
    samples = Samples()
    before = machine()
    plan = [("predicted", args.n), ("measured", args.measured_runs)]
    for scenario, runs in plan:
        for i in range(runs):
            with SpeculativeClient(
                args.url, fresh_token(dsn, "t1-latency", name="bench/t1_latency.py")
            ) as client:
                print(f"{scenario} {i + 1}/{runs}: cache miss ...", file=sys.stderr, flush=True)
                run = miss(client, scenario, samples)
                winner = run.winner.candidate.candidate_id if run.winner is not None else "none"
                print(
                    f"  {run.id} completed, winner {winner}; {args.n} cache hits", file=sys.stderr, flush=True
                )
                hits(client, scenario, args.n, samples)

    rows = summarise(samples)
    result = {
        "gateway": args.url or default_url(),
        "workload": WORKLOAD,
        "targets": TARGETS,
        "runs": dict(plan),
        "hits_per_miss": args.n,
        "machine": before | {"load_average_after": os.getloadavg()},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["pass"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
