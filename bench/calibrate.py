"""The predictor's calibration set: measure it, fit the predictor to it, and score the fit.

1. measure: per workload, the catalog's candidates for the target on the CPU profile
   (services/predictor/calibration_set.py) whose ids match GRID — each family's key
   options — decode the same prompts with their own ``none`` in one interleaved run
   (speccore.bench.interleave: warm-up, rotating order), greedy, batch 1. One row per
   candidate: its speedup over that ``none``, acceptance, mean acceptance length and per
   step draft / verify times. Workloads already in --out are kept (resumable).
2. fit: the rows become the predictor's calibration file for this target and host
   (services/predictor/calibration.py: acceptance per family x fingerprint, measured
   step costs per shape, the family prior's scale), which the predictor loads.
3. evaluate: predicted against measured speedups, in-sample (fitted on every workload),
   leave-one-workload-out (fitted on the others) and, with --held-out, on a second set
   measured on other prompts of the same workloads (--prompt-offset): Spearman over all
   rows and the top-1 rule per workload (predicted best within 5 % of the measured best).
   Written into --out and appended to bench/results/predictor-calibration.json.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/calibrate.py --prompt-offset 8 --measure-only \
        --out bench/results/calibration-smollm2-heldout-cpu2.json
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/calibrate.py \
        --out bench/results/calibration-smollm2-cpu2.json \
        --held-out bench/results/calibration-smollm2-heldout-cpu2.json

OMP_WAIT_POLICY=PASSIVE: on a CPU shared with other jobs, idle OpenMP threads that spin
take the cores the decoding threads need (measured here beside three other jobs: 1.96 s a
token with the default policy, 0.12 s with PASSIVE).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import machine

from specops_services.predictor.calibration_set import CalibrationPoint, calibration_point, select

MODEL = "smollm2-135m-instruct"
WORKLOADS = (
    "chat",
    "code",
    "structured",
    "agentic",
    "summarization",
    "rag",
    "reasoning",
    "creative",
    "long_context",
)
# long_context prompts fill smollm2's whole context (8192 tokens) less the new tokens, and
# every method of a workload reuses the prefill of the first method that read the same
# features (shared_prefill): an 8k-token prefill takes minutes on the 2-core CPU, a step
# at that width a few times a short one's.
LONG_CONTEXT_TOKENS = 8192
SHARED_PREFILL = frozenset({"long_context"})
# Each family's key options: ngram's depth, suffix's path and tree at factors 1 and 2, EAGLE as a chain and as
# the catalog's widest 3-deep tree, Medusa at that tree (its chain of 4 trails it), rest
# and lookahead at their first shape (rest only where the catalog keeps it: code).
GRID = (
    "ngram-k2-n1-4",
    "ngram-k4-n1-4",
    "ngram-k8-n1-4",
    "lookahead-w5-n4-g5",
    "rest-k4-",
    "medusa-k3-t4x2x1-",
    "eagle-k3-chain-",
    "eagle-k3-t4x2x1-",
    "suffix-k16-path",
    "suffix-k16-tree",
    "suffix-k16-f2-path",
    "suffix-k16-f2-tree",
)
DRAFT_GRID = ("draft_model-k4-self7",)
TRACKED = Path("bench/results/predictor-calibration.json")
# calibration_eval.evaluate's scores; the held-out ones only with --held-out.
MODES = (
    "prior_only",
    "leave_one_fingerprint_out",
    "leave_one_workload_out",
    "in_sample",
    "held_out_prompts",
    "held_out_by_measurement",
)


def measure_workload(
    target: Any, point: CalibrationPoint, args: argparse.Namespace, grid: tuple[str, ...]
) -> list[dict[str, Any]]:
    """One interleaved run of `none` and the point's candidates that ``grid`` selects; a row
    per candidate."""
    from speccore.bench import Schedule, bench_engine, engine_method, interleave
    from speccore.candidates import speccore_candidate
    from speccore.metrics import GenerationMetrics
    from specprompts.corpora import builtin_datastore
    from specprompts.sets import prompts_for_model

    candidates = {c.candidate_id: c for c in select(point.candidates, grid)}
    shared = point.workload in SHARED_PREFILL
    n_prompts = args.long_context_prompts if point.workload == "long_context" else args.n_prompts
    prompts = prompts_for_model(
        target,
        point.workload,
        args.prompt_offset + n_prompts,
        max_new_tokens=args.max_new_tokens,
        long_context_tokens=args.long_context_tokens,
    )[args.prompt_offset :]
    exclude = frozenset(p.id for p in prompts)
    engines = {"none": bench_engine(target, "none")}
    for cid, cand in candidates.items():
        how = speccore_candidate(cand)
        config = how.config
        if config.datastore is not None:
            built = builtin_datastore(target, config.datastore, point.workload, exclude)
            config = dataclasses.replace(config, datastore=str(built))
        engines[cid] = bench_engine(target, how.family, config)
    if shared:
        share_prefill(engines.values())
    methods = {name: engine_method(engine) for name, engine in engines.items()}
    schedule = Schedule(
        prompts=[target.encode_prompt(p.text, p.chat) for p in prompts],
        reps=1,
        max_new_tokens=args.max_new_tokens,
    )
    runs: dict[str, Any] = {}
    failures = interleave(
        schedule,
        methods,
        lambda run: runs.__setitem__(run.method, run),
        baseline="none",
        log=lambda msg: print(f"[{point.workload}] {msg}", file=sys.stderr, flush=True),
    )
    none = runs["none"]

    def per_step(run: Any) -> dict[str, float]:
        total = GenerationMetrics()
        for m in run.metrics:
            for name in (
                "verify_steps",
                "drafted_tokens",
                "accepted_tokens",
                "draft_time_s",
                "verify_time_s",
            ):
                setattr(total, name, getattr(total, name) + getattr(m, name))
        steps = max(total.verify_steps, 1)
        return {
            "verify_steps": total.verify_steps,
            "acceptance": total.acceptance_rate,
            "mean_acceptance_length": total.mean_acceptance_length,
            "drafted_per_step": total.drafted_tokens / steps,
            "draft_s_per_step": total.draft_time_s / steps,
            "verify_s_per_step": total.verify_time_s / steps,
            "seconds": run.seconds,
            "new_tokens": run.new_tokens,
        }

    def decode_rate(run: Any) -> float:
        """Tokens a second of the decoding steps alone (prefill and what the steps share left out)."""
        return run.new_tokens / max(sum(m.draft_time_s + m.verify_time_s for m in run.metrics), 1e-9)

    base = per_step(none)
    rows = []
    for cid, cand in candidates.items():
        if cid in failures or cid not in runs:
            print(f"[{point.workload}] {cid} failed: {failures.get(cid)}", file=sys.stderr)
            continue
        run = runs[cid]
        rows.append(
            {
                "workload": point.workload,
                "fingerprint": str(point.serving.fingerprint),
                "family": str(cand.family),
                "candidate": cand.model_dump(mode="json"),
                # With a shared prefill the first method to read a prompt pays its prefill, so
                # the speedup is of the decoding steps alone (end to end beside it).
                "speedup": decode_rate(run) / decode_rate(none) if shared else run.speedup,
                **({"speedup_basis": "decoding steps", "end_to_end_speedup": run.speedup} if shared else {}),
                "prompt_tokens": [m.prompt_tokens for m in run.metrics],
                "identical": run.token_ids == none.token_ids,
                **per_step(run),
                "none_decode_s_per_step": base["verify_s_per_step"],
            }
        )
    return rows


def share_prefill(engines: Any) -> None:
    """Give the engines that read the same features (none: none) one prefix cache, so a
    prompt is prefilled once per such group and the others reuse its keys and values, which
    the row-invariant CPU kernels make the very bits of their own prefill."""
    from speccore.prefix_cache import PrefixCache

    caches: dict[tuple[int, ...] | None, PrefixCache] = {}
    for engine in engines:
        reads = engine.proposer is not None and engine.proposer.needs_hidden_states
        signature = engine.taps if reads else None
        # One scope (the rep's) holding one prompt of the whole context with its features.
        engine.prefix_cache = caches.setdefault(signature, PrefixCache(max_bytes=2**31, max_scopes=1))


def measure(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Measure the workloads missing from ``data``; with --remeasure, that family's rows of
    every workload again (a fresh ``none`` beside them), in place of the old ones."""
    import torch

    from speccore.models import load_model

    family = args.remeasure
    grid = GRID + (DRAFT_GRID if args.drafts else ())
    if family:
        grid = tuple(g for g in grid if g.startswith(f"{family}-"))
        if not grid:
            raise SystemExit(f"--remeasure {family}: no such family in the grid {', '.join(GRID)}")
        measured_at = data["protocol"].get("prompt_offset", 0)  # sets older than the option: 0
        if args.prompt_offset != measured_at:
            raise SystemExit(
                f"--remeasure: {args.out} was measured at --prompt-offset "
                f"{measured_at}, not {args.prompt_offset}"
            )
        note = data.setdefault("remeasured", {}).setdefault(
            family, {"date": time.strftime("%Y-%m-%d"), "why": args.why, "workloads": []}
        )
        data["protocol"]["grid"] = list(GRID)  # the grid the rows now follow
        done = set(note["workloads"])
    else:
        done = {row["workload"] for row in data["rows"]}
    torch.set_num_threads(args.threads)
    target = load_model(MODEL, device="cpu")
    for workload in args.workloads:
        if workload in done:
            continue
        started = time.time()
        if workload == "long_context":
            data["protocol"]["long_context"] = {
                "n_prompts": args.long_context_prompts,
                "prompt_token_budget": args.long_context_tokens,
                "shared_prefill": True,
            }
        rows = measure_workload(target, calibration_point(MODEL, workload), args, grid)
        if family:  # the new rows take the old ones' place
            data["rows"] = [r for r in data["rows"] if (r["workload"], r["family"]) != (workload, family)]
            note["workloads"].append(workload)
        else:
            data["workload_seconds"][workload] = round(time.time() - started, 1)
        data["rows"] += rows
        _write(args.out, data)
        print(f"[{workload}] {len(rows)} rows in {time.time() - started:.0f} s", file=sys.stderr, flush=True)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it, else absolute."""
    resolved, here = path.resolve(), Path.cwd().resolve()
    return str(resolved.relative_to(here) if resolved.is_relative_to(here) else resolved)


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def score(args: argparse.Namespace, data: dict[str, Any]) -> None:
    from specops_services.predictor.calibration import CALIBRATION_DIR, CalibrationRow, write_calibration
    from specops_services.predictor.calibration_eval import evaluate
    from specops_services.predictor.calibration_set import fit

    rows = [CalibrationRow.from_json(r) for r in data["rows"]]
    held_out = (
        [CalibrationRow.from_json(r) for r in json.loads(args.held_out.read_text())["rows"]]
        if args.held_out
        else []
    )
    points = {w: calibration_point(MODEL, w) for w in dict.fromkeys(r.workload for r in [*rows, *held_out])}
    written = write_calibration(
        fit(rows, points, source=str(args.out)), args.calibration_dir or CALIBRATION_DIR
    )
    data["evaluation"] = evaluate(rows, points, held_out)
    _write(args.out, data)
    modes = [m for m in MODES if m in data["evaluation"]]
    summary = {
        mode: {key: data["evaluation"][mode][key] for key in ("spearman", "top1_rate", "meets_bar")}
        for mode in modes
    }
    tracked = json.loads(TRACKED.read_text()) if TRACKED.exists() else {"runs": []}
    tracked["runs"].append(
        {
            "date": time.strftime("%Y-%m-%d"),
            "calibration_set": str(args.out),
            "calibration_file": _shown(written),
            **({"held_out_set": str(args.held_out)} if args.held_out else {}),
            "rows": len(rows),
            "workloads": list(points),
            **summary,
        }
    )
    _write(TRACKED, tracked)
    print(json.dumps(summary, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/calibration-smollm2-cpu2.json"))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument(
        "--prompt-offset",
        type=int,
        default=0,
        help="skip each workload's first N prompts (a held-out set: --prompt-offset 8)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--long-context-tokens",
        type=int,
        default=LONG_CONTEXT_TOKENS,
        help="long_context prompt budget (capped at the model's context less the new tokens)",
    )
    parser.add_argument(
        "--long-context-prompts", type=int, default=4, help="long_context prompts per set (8k-token prefills)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafts", action="store_true", help="also measure draft_model self:7 (slow)")
    parser.add_argument(
        "--calibration-dir", type=Path, help="where the fitted file goes (default: the predictor's)"
    )
    parser.add_argument("--measure-only", action="store_true", help="measure the missing workloads only")
    parser.add_argument(
        "--held-out",
        type=Path,
        help="a set measured on other prompts (--prompt-offset): score the fit on its rows too",
    )
    parser.add_argument("--skip-measure", action="store_true", help="fit and score the rows in --out only")
    parser.add_argument(
        "--remeasure",
        metavar="FAMILY",
        help="measure FAMILY's rows of every workload again, in place of the old ones (resumable)",
    )
    parser.add_argument("--why", default="", help="with --remeasure: the reason, recorded in --out")
    args = parser.parse_args()
    data: dict[str, Any] = (
        json.loads(args.out.read_text())
        if args.out.exists()
        else {
            "model": MODEL,
            "machine": machine(),
            "protocol": {
                "n_prompts": args.n_prompts,
                "prompt_offset": args.prompt_offset,
                "max_new_tokens": args.max_new_tokens,
                "reps": 1,
                "threads": args.threads,
                "sampling": "greedy",
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
                "batch_size": 1,
                "grid": list(GRID),
            },
            "workload_seconds": {},
            "rows": [],
        }
    )
    if not args.skip_measure:
        measure(args, data)
    if not args.measure_only:
        score(args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
