"""speccore against vLLM's CPU build on the same prompts and settings: `make engines-bench`.

Per workload (chat, code, agentic), greedy, each engine measures none, ngram, suffix and its
best learned draft with its own interleaved protocol, ratios against its own `none` in the
same reps:

- speccore in this process (``speccore.bench.run_bench``, the protocol of `specops bench`),
  its learned draft the shipped EAGLE head;
- vLLM over HTTP (the benchmark-runner's ``measure_http``): a server per method, launched
  from the flags `apply` renders for the same candidates (ngram k=5 with the window 1..4,
  suffix k=16 with vLLM's defaults) and the engine environment's server settings
  (float32, eager). No learned draft: see VLLM_LEARNED.

"identical" is each method's greedy output against its own engine's `none`: token for
token in speccore, prompt for prompt in vLLM (its servers' token ids). What vLLM's CPU
build cannot run here is listed with the reason (`apply`'s refusal). Writes one JSON
file::

    .venv/bin/python bench/engines.py --out bench/results/engines-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from common import command_of, http_rows, machine, rows_line, vllm_or_exit

from speccatalog.workloads import fingerprint_of
from speccore.bench import BenchSpec, run_bench
from speccore.models import load_model
from specops_schemas.api import Target
from specops_schemas.candidates import Candidate, Sampling
from specops_schemas.catalog import Engine, Family
from specops_schemas.engine_flags import EngineCannotRun, engine_config
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.engine_server import HttpEngine
from specops_services.benchmark_runner.measure_http import measure_http
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specplatform import engines
from specprompts.sets import load_prompts

MODEL = "smollm2-135m-instruct"
WORKLOADS = ("chat", "code", "agentic")
NGRAM = Candidate(candidate_id="ngram", family=Family.NGRAM, k=5, options={"ngram_min": 1, "ngram_max": 4})
SUFFIX = Candidate(candidate_id="suffix", family=Family.SUFFIX, k=16)
# speccore's methods for the same candidates (`specops bench` names), and its best learned
# draft: the shipped EAGLE head (builtin:eagle, the default tree).
SPECCORE_METHODS = {"ngram": "ngram:ngram_min=1:ngram_max=4", "suffix": "suffix", "eagle": "eagle"}
SPECCORE_HEADS = ("builtin:eagle",)
# vLLM's learned draft on this build: EAGLE-3 heads in the speculators layout run (an
# untrained smollm2 head exported with `specops heads export` drafted on vLLM's CPU build,
# its output identical to none), but no trained EAGLE-3 head for smollm2 ships, and
# speccore's built-in EAGLE head (EAGLE-1 layout) does not load in vLLM.
VLLM_LEARNED = (
    "none measured: EAGLE-3 heads in the speculators layout run on this build, but no trained "
    "EAGLE-3 head for smollm2 ships (speccore's built-in EAGLE head has the EAGLE-1 layout)"
)
# What a user would also ask vLLM for, and why this build cannot run it.
NOT_ON_VLLM = {
    "eagle (speccore's built-in head)": Candidate(
        candidate_id="eagle", family=Family.EAGLE, k=5, draft="builtin:eagle"
    ),
    "suffix tree (use_tree_spec)": Candidate(
        candidate_id="suffix-tree", family=Family.SUFFIX, k=16, options={"use_tree_spec": 1}
    ),
}


def speccore_side(workload: str, n: int, tokens: int, reps: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    target = load_model(MODEL, device="cpu", dtype="float32")
    spec = BenchSpec(
        workload=workload,
        methods=["none", *SPECCORE_METHODS.values()],
        n_prompts=n,
        max_new_tokens=tokens,
        reps=reps,
        heads=SPECCORE_HEADS,
    )
    result = run_bench(target, spec, load_prompts(workload, n, 0), log=lambda m: print(f"  speccore {m}"))
    methods = result["methods"]
    assert isinstance(methods, dict)
    named = {"none": "none", **{v: k for k, v in SPECCORE_METHODS.items()}}
    return {
        named[m]: {
            "tokens_per_s": r["tokens_per_s_median"],
            "speedup": r["speedup_vs_none"],
            "mean_acceptance_length": r.get("mean_acceptance_length"),
            "identical_to_none": r.get("identical_to_baseline"),
        }
        for m, r in methods.items()
    } | ({"failures": result["failures"]} if result.get("failures") else {})


def vllm_side(workload: str, n: int, tokens: int, reps: int, threads: int) -> dict[str, Any]:
    prompts = load_prompts(workload, n, 0)  # the same as speccore's (agentic is no wire fingerprint)
    plan = BenchPlan(
        run_id=f"engines-bench-{workload}",
        target=Target(model_ref=MODEL, gpu="cpu", engine="vllm"),
        fingerprint=fingerprint_of(workload),
        mode="interactive",
        quality_gate="topk5",  # greedy: the servers' token ids against the baseline's as well
        candidates=[NGRAM, SUFFIX],
        reps=reps,
        n_prompts=n,
        max_new_tokens=tokens,
        sampling=Sampling(temperature=0.0),
        seed=0,
    )
    settings = BenchmarkRunnerSettings(threads=threads, bench_device="cpu")
    outcome = measure_http(
        plan,
        HttpEngine.VLLM,
        settings,
        on_rep=lambda row: print(f"  vllm {row.candidate_id}"),
        prompts=prompts,
    )
    return http_rows(outcome)


def not_on_vllm() -> dict[str, str]:
    refused = {}
    for name, candidate in NOT_ON_VLLM.items():
        try:
            engine_config(candidate, Engine.VLLM)
        except EngineCannotRun as err:
            refused[name] = str(err)
    return refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/engines-cpu2.json"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--n-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    state = vllm_or_exit(parser)
    settings = {"greedy": True, **vars(args), "vllm_server_args": list(engines.VLLM.server_args)}
    out: dict[str, Any] = {
        "command": command_of("bench/engines.py", args),
        "machine": machine(),
        "model": MODEL,
        "vllm": state.reason,
        "settings": settings | {"out": str(args.out)},
        "not_on_vllm": not_on_vllm(),
        "vllm_learned_draft": VLLM_LEARNED,
        "workloads": {},
    }
    for workload in args.workloads.split(","):
        started = time.monotonic()
        print(f"{workload}: speccore")
        speccore = speccore_side(workload, args.n_prompts, args.max_new_tokens, args.reps, args.threads)
        print(f"{workload}: vllm")
        vllm = vllm_side(workload, args.n_prompts, args.max_new_tokens, args.reps, args.threads)
        out["workloads"][workload] = {
            "speccore": speccore,
            "vllm": vllm,
            "seconds": time.monotonic() - started,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    for workload, both in out["workloads"].items():
        for engine, rows in both.items():
            if engine == "seconds":
                continue
            print(f"{workload:8} {engine:8} {rows_line(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
