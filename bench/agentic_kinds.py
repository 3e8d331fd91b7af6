"""Suffix decoding against n-gram on each kind of the agentic set, apart.

``specops bench --workload agentic`` measures the set as it comes, its kinds in turn; this
measures the same protocol (speccore.bench.run_bench: interleaved, warmed up, one draft
scope per rep) on the first ``--per-kind`` prompts of each kind, so a result says where a
cross-request draft source pays: on retries, whose outputs repeat earlier outputs that no
prompt shows, or on sessions and edit loops, whose outputs repeat their own prompt.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/agentic_kinds.py --per-kind 6 --reps 1 \\
        --out bench/results/smollm2-135m-instruct-agentic-kinds-greedy-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from speccore.bench import BenchSpec, run_bench
from speccore.models import load_model
from specprompts.agentic import KINDS, kind_of
from specprompts.sets import load_prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--methods", default="none,ngram,suffix")
    parser.add_argument("--per-kind", type=int, default=6)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model)
    prompts = load_prompts("agentic", len(KINDS) * args.per_kind)
    results = {}
    for kind in KINDS:
        chosen = [p for p in prompts if kind_of(p.id) == kind]
        spec = BenchSpec(
            workload="agentic",
            methods=args.methods.split(","),
            n_prompts=len(chosen),
            max_new_tokens=args.max_new_tokens,
            reps=args.reps,
        )
        print(f"{kind}: {len(chosen)} prompts", file=sys.stderr)
        results[kind] = run_bench(target, spec, chosen, log=lambda msg: print(msg, file=sys.stderr))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"per_kind": args.per_kind, "kinds": results}, indent=2))
    print(table(results))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def table(results: dict[str, dict]) -> str:
    """Markdown: per kind and method, the speedup over none, the mean acceptance length and
    whether the output was none's."""
    lines = [
        "| kind | method | speedup vs none | mean acceptance length | identical to none |",
        "|---|---|---|---|---|",
    ]
    for kind, result in results.items():
        for name, r in result["methods"].items():
            same = "yes" if r["identical_to_baseline"] else "NO"
            speedup, mal = r["speedup_vs_none"], r["mean_acceptance_length"]
            lines.append(f"| {kind} | {name} | {speedup:.2f}x | {mal:.2f} | {same} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
