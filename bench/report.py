"""Markdown tables of `specops bench` result files, as quoted in the README.

A file may also hold several bench results: one per kind (``kinds``, bench/agentic_kinds.py)
or a list of runs (``runs``, e.g. a sweep of shapes); each gets its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tables(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    if "methods" in data:
        return [table(data, path)]
    kinds = [table(r, path, kind) for kind, r in data.get("kinds", {}).items()]
    return kinds + [table(r, path, r.get("config", "")) for r in data.get("runs", [])]


def table(r: dict, path: Path, label: str = "") -> str:
    """One bench result's table; ``label`` names it within a file of several."""
    spec, machine = r["spec"], r["machine"]
    policy = machine.get("omp_wait_policy")
    omp = f", OMP_WAIT_POLICY={policy}" if policy and policy != "default" else ""
    named = f" ({label})" if label else ""
    lines = [
        f"`{spec['workload']}`{named}: {r['model']}, {len(r['prompt_ids'])} prompts x {spec['reps']} reps, "
        f"{spec['max_new_tokens']} new tokens, temperature {spec['sampling']['temperature']:g}, "
        f"batch {spec['batch_size']}, {machine['threads']} threads{omp}, {machine['date']} (`{path}`)",
        "",
        "| method | tok/s (median) | speedup vs none | limit if drafting were free | acceptance "
        "| mean acceptance length | identical to none |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in r["methods"].items():
        acc = f"{m['acceptance_rate']:.2f}" if "acceptance_rate" in m else "-"
        mal = f"{m['mean_acceptance_length']:.2f}" if "mean_acceptance_length" in m else "-"
        same = {True: "yes", False: "**no**"}.get(m.get("identical_to_baseline"), "-")
        free = f"{m['free_drafting_limit']:.2f}x" if "free_drafting_limit" in m else "-"
        tps, speedup = m["tokens_per_s_median"], m["speedup_vs_none"]
        lines.append(f"| {name} | {tps:.2f} | {speedup:.2f}x | {free} | {acc} | {mal} | {same} |")
    lines.extend(f"| {name} | failed: {why} | | | | | |" for name, why in r.get("failures", {}).items())
    limit = r["plain_decoding_limit"]
    lines.append(
        f"| plain-decoding limit | {limit['tokens_per_s']:.1f} | "
        f"{limit['tokens_per_s'] / r['methods']['none']['tokens_per_s_median']:.2f}x | | "
        f"weights {r['weight_bytes'] / 1e6:.0f} MB / read bandwidth "
        f"{limit['read_bandwidth_gb_s']:.1f} GB/s | | |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(t for p in sys.argv[1:] for t in tables(Path(p))))
