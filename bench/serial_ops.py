"""What running a small block's small ops on one thread buys (``cpu_kernels.serial_small_ops``).

The same engines decode the same prompts with the small ops of each decoding step on one
thread (``serial``) and on all of PyTorch's threads (``all``), the two interleaved within
every rep and method, their order alternating by rep, after a warm-up of both. Reports
per method the median seconds of each, their ratio, and whether the tokens are the same.
The OpenMP wait policy decides what there is to gain, so run it under both: speccore
turns ``serial`` on only where idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``); here it
is forced on and off whatever the policy.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/serial_ops.py \\
        --out bench/results/serial-ops-passive-smollm2-cpu2.json
    .venv/bin/python bench/serial_ops.py --out bench/results/serial-ops-spin-smollm2-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from common import machine

from speccore import cpu_kernels
from speccore.bench import bench_engine, method_variant
from speccore.engine import Engine, Request
from speccore.models import load_model
from speccore.proposers.base import ProposerConfig
from specprompts.sets import load_prompts

VARIANTS = {"serial": cpu_kernels.SERIAL_MAX_ROWS, "all": 0}


def decode(engine: Engine, prompts: list[list[int]], max_new_tokens: int, scope: str) -> list[list[int]]:
    """Each prompt alone, in order; ``scope`` names a fresh draft pool (suffix's outputs)."""
    return [
        engine.generate([Request(ids, max_new_tokens, draft_scope=scope)])[0].token_ids for ids in prompts
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--workload", default="agentic")
    parser.add_argument(
        "--methods", default="none,ngram,suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2"
    )
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu_kernels.IDLE_THREADS_SLEEP = True  # serial_small_ops runs whenever SERIAL_MAX_ROWS allows
    target = load_model(args.model)
    prompts = [target.encode_user_prompt(p.text, p.chat) for p in load_prompts(args.workload, args.n_prompts)]
    engines: dict[str, Engine] = {}
    for method in args.methods.split(","):
        family, knobs = method_variant(method)
        engines[method] = bench_engine(target, family, ProposerConfig(knobs=knobs) if knobs else None)
    seconds: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], list[list[int]]] = {}
    for rep in range(args.reps + 1):  # round 0 warms up
        order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
        for method, engine in engines.items():
            for variant in order:
                cpu_kernels.SERIAL_MAX_ROWS = VARIANTS[variant]
                started = time.perf_counter()
                out = decode(engine, prompts if rep else prompts[:1], args.max_new_tokens, f"{rep}-{variant}")
                elapsed = time.perf_counter() - started
                if rep:
                    seconds.setdefault((method, variant), []).append(elapsed)
                    tokens.setdefault((method, variant), out)
                    print(f"rep {rep} {method} {variant}: {elapsed:.1f} s", file=sys.stderr, flush=True)
    results = {}
    for method in engines:
        serial, every = (statistics.median(seconds[(method, v)]) for v in VARIANTS)
        results[method] = {
            "serial_s_median": round(serial, 2),
            "all_threads_s_median": round(every, 2),
            "speedup_serial_vs_all": round(every / serial, 3),
            "serial_s_reps": [round(s, 2) for s in seconds[(method, "serial")]],
            "all_threads_s_reps": [round(s, 2) for s in seconds[(method, "all")]],
            "identical_tokens": tokens[(method, "serial")] == tokens[(method, "all")],
        }
    result = {
        "model": args.model,
        "machine": machine()
        | {"threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")},
        "workload": args.workload,
        "n_prompts": args.n_prompts,
        "max_new_tokens": args.max_new_tokens,
        "reps": args.reps,
        "serial_max_rows": VARIANTS["serial"],
        "methods": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for method, r in results.items():
        print(
            f"{method}: serial {r['serial_s_median']} s, all threads {r['all_threads_s_median']} s, "
            f"{r['speedup_serial_vs_all']}x, identical {r['identical_tokens']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
