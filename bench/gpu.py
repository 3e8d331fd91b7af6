"""speccore on a CUDA GPU: greedy identity per family, speedups at batch 1, and the
continuous batcher at 32 rows.

What only a GPU shows: whether each family stays token-for-token lossless with CUDA's
kernels (float32 and bfloat16), what a verify block costs there (larger trees pay where a
block of many tokens costs one), and whether speculation still pays when 32 requests
share a step. Writes one JSON file:

- ``bench``: ``speccore.bench.run_bench`` (the interleaved protocol of ``specops bench``)
  per (dtype, prompt set): tokens/s, speedup over ``none`` in the same reps, acceptance,
  and ``identical_to_baseline`` for every method;
- ``batcher``: 32 requests through ``ContinuousBatcher`` per method (fixed k and adaptive
  k), interleaved reps: tokens/s, the ratio to ``none`` in the same rep, and whether every
  request's tokens equal ``none``'s.

    .venv/bin/python bench/gpu.py --out bench/results/gpu-h100.json
    .venv/bin/python bench/gpu.py --plan suffix --out bench/results/gpu-h100-suffix.json

``--plan heads`` (the default) measures the families above; ``--plan suffix`` measures
suffix decoding against n-gram on the agentic, chat and code sets. ``--sets`` and
``--methods`` narrow a plan; ``--prefix-cache`` gives every method a prefix cache.

The prompt sets come from the packaged data (chat, code, the heads' held-out chat). On a
host without those packages, write them elsewhere with ``--export-prompts FILE`` and pass
``--prompts FILE``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from speccore.batching import ContinuousBatcher
from speccore.bench import BenchSpec, run_bench
from speccore.engine import Engine, Request
from speccore.models import LoadedModel, load_model
from speccore.proposers.base import ProposerConfig

HELDOUT = Path("artifacts/heads/smollm2-135m-instruct/data/heldout.jsonl")
HEADS = ("builtin:medusa", "builtin:eagle")
ALL_METHODS = ("none", "hf", "ngram", "lookahead", "draft_model", "medusa", "eagle")
# Where a verify block of many tokens costs about one token, a bigger tree pays.
BIG_TREE = {"tree_topk": 4, "tree_tokens": 16}
BATCHER = "batcher"
# What a plan measures per dtype, in order (prompt set or BATCHER, methods, tree knobs). The
# heads plan: the heads' held-out chat first, then 32 rows through the batcher, then the rest.
Plan = tuple[tuple[str, tuple[str, ...], dict[str, int]], ...]
HEADS_PLAN: Plan = (
    ("heldout-chat", ALL_METHODS, {}),
    (BATCHER, (), {}),
    ("chat", ALL_METHODS, {}),
    ("code", ("none", "ngram", "lookahead", "draft_model", "eagle"), {}),
    ("heldout-chat", ("none", "medusa", "eagle"), BIG_TREE),
)
# Suffix decoding against prompt lookup where a verify block costs about one token: the
# repetitive agentic set first (what suffix decoding is for), then chat and code; suffix as
# vLLM drafts it (a path, factor 1) and as speccore's best CPU shape (a tree, factor 2).
SUFFIX_TREE = "suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2"
SUFFIX_PLAN: Plan = tuple(
    (name, ("none", "ngram", "suffix", SUFFIX_TREE), {}) for name in ("agentic", "chat", "code")
)
PLANS = {"heads": HEADS_PLAN, "suffix": SUFFIX_PLAN}


@dataclass(frozen=True, slots=True)
class FilePrompt:
    id: str
    text: str
    chat: bool


@dataclass(frozen=True, slots=True)
class BatcherMethod:
    method: str
    config: ProposerConfig
    adaptive: bool = False


BATCHER_METHODS = {
    "none": BatcherMethod("none", ProposerConfig()),
    "ngram-k4": BatcherMethod("ngram", ProposerConfig(k=4)),
    "ngram-adaptive": BatcherMethod("ngram", ProposerConfig(k=4), adaptive=True),
    "eagle": BatcherMethod("eagle", ProposerConfig(head="builtin:eagle")),
    "eagle-adaptive": BatcherMethod("eagle", ProposerConfig(head="builtin:eagle"), adaptive=True),
}


def packaged_prompts(n: int) -> dict[str, list[FilePrompt]]:
    from specprompts.sets import file_prompts, load_prompts

    sets = {
        "chat": load_prompts("chat", n),
        "code": load_prompts("code", n),
        "heldout-chat": file_prompts(HELDOUT, n),
        "agentic": load_prompts("agentic", n),
    }
    return {name: [FilePrompt(p.id, p.text, p.chat) for p in ps] for name, ps in sets.items()}


def read_prompts(path: Path) -> dict[str, list[FilePrompt]]:
    return {name: [FilePrompt(**p) for p in ps] for name, ps in json.loads(path.read_text()).items()}


def device_facts(target: LoadedModel) -> dict[str, Any]:
    facts: dict[str, Any] = {"torch": torch.__version__, "device": str(target.device)}
    if target.device.type == "cuda":
        props = torch.cuda.get_device_properties(target.device)
        facts |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    return facts


def _sync(target: LoadedModel) -> None:
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)


def _drain(batcher: ContinuousBatcher, requests: list[Request], per_step: int) -> dict[int, list[int]]:
    """Feed ``requests`` into the batcher ``per_step`` at a time; every request's tokens."""
    out: dict[int, list[int]] = {}
    order: list[int] = []
    pending = list(requests)
    while pending or not batcher.idle:
        order.extend(batcher.add(r) for r in pending[:per_step])
        del pending[:per_step]
        for update in batcher.step().updates:
            if update.finished and update.generation is not None:
                out[update.handle] = update.generation.token_ids
    return {i: out[handle] for i, handle in enumerate(order)}


def batcher_bench(
    target: LoadedModel,
    prompts: list[FilePrompt],
    *,
    rows: int,
    max_new_tokens: int,
    reps: int,
    per_step: int,
    log: Any,
) -> dict[str, Any]:
    """Each method decodes the same ``rows`` requests through its own batcher, in an order
    rotating with the rep; ratios are to ``none`` in the same rep."""
    engines = {
        label: Engine(target, m.method, m.config, adaptive=m.adaptive) for label, m in BATCHER_METHODS.items()
    }
    ids = [target.encode_prompt(p.text, p.chat) for p in prompts]
    requests = [Request(ids[i % len(ids)], max_new_tokens=max_new_tokens) for i in range(rows)]
    for engine in engines.values():  # warm-up: allocator, kernels, the adaptive model's first costs
        _drain(ContinuousBatcher(engine, max_rows=rows), requests[:4], per_step)
    tps: dict[str, list[float]] = {label: [] for label in engines}
    ratio: dict[str, list[float]] = {label: [] for label in engines}
    tokens: dict[str, dict[int, list[int]]] = {}
    labels = list(engines)
    for rep in range(reps):
        shift = rep % len(labels)
        rep_tps: dict[str, float] = {}
        for label in labels[shift:] + labels[:shift]:
            _sync(target)
            t0 = time.perf_counter()
            out = _drain(ContinuousBatcher(engines[label], max_rows=rows), requests, per_step)
            _sync(target)
            seconds = time.perf_counter() - t0
            rep_tps[label] = sum(len(t) for t in out.values()) / seconds
            tokens.setdefault(label, out)
            log(f"batcher rep {rep} {label}: {rep_tps[label]:.1f} tok/s")
        for label, value in rep_tps.items():
            tps[label].append(value)
            ratio[label].append(value / rep_tps["none"])
    return {
        "rows": rows,
        "max_new_tokens": max_new_tokens,
        "reps": reps,
        "arrivals_per_step": per_step,
        "methods": {
            label: {
                "method": BATCHER_METHODS[label].method,
                "adaptive_k": BATCHER_METHODS[label].adaptive,
                "tokens_per_s_median": statistics.median(tps[label]),
                "tokens_per_s_reps": tps[label],
                "speedup_vs_none": statistics.median(ratio[label]),
                "identical_to_none": tokens[label] == tokens["none"],
            }
            for label in labels
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated (float32, bfloat16)")
    p.add_argument("--plan", choices=sorted(PLANS), default="heads", help="what to measure (see PLANS)")
    p.add_argument("--prompts", type=Path, help="JSON written by --export-prompts")
    p.add_argument("--export-prompts", type=Path, help="write the packaged prompt sets to this file and stop")
    p.add_argument("--n-prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--batch-rows", type=int, default=32)
    p.add_argument("--out", type=Path, required=False)
    p.add_argument("--sets", help="comma-separated prompt sets of the plan to measure (default: all)")
    p.add_argument("--methods", help="comma-separated methods, instead of each prompt set's in the plan")
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="give every method a prefix cache (as specops bench --prefix-cache)",
    )
    args = p.parse_args()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    if args.export_prompts:
        sets = packaged_prompts(args.n_prompts)
        args.export_prompts.write_text(json.dumps({k: [asdict(p) for p in v] for k, v in sets.items()}))
        return 0
    if args.out is None:
        p.error("--out is required")
    sets = read_prompts(args.prompts) if args.prompts else packaged_prompts(args.n_prompts)
    result: dict[str, Any] = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
        "plan": args.plan,
        "bench": {},
        "batcher": {},
    }
    for dtype in args.dtypes.split(","):
        target = load_model(args.model, device=args.device, dtype=dtype)
        result["machine"] = device_facts(target)
        for name, methods, tree in PLANS[args.plan]:
            if args.sets and name not in args.sets.split(","):
                continue
            key = f"{dtype}/{name}" + (f"/tree{tree['tree_tokens']}" if tree else "")
            if name == BATCHER:
                log(f"== {dtype}/batcher")
                result["batcher"][dtype] = batcher_bench(
                    target,
                    sets["chat"],
                    rows=args.batch_rows,
                    max_new_tokens=args.max_new_tokens,
                    reps=args.reps,
                    per_step=4,
                    log=log,
                )
            else:
                log(f"== {key}")
                spec = BenchSpec(
                    workload=name,
                    methods=args.methods.split(",") if args.methods else list(methods),
                    n_prompts=min(args.n_prompts, len(sets[name])),
                    max_new_tokens=args.max_new_tokens,
                    reps=args.reps,
                    draft="self:12",
                    heads=HEADS if {"medusa", "eagle"} & set(methods) else (),
                    tree=dict(tree),
                    prefix_cache=args.prefix_cache,
                )
                result["bench"][key] = run_bench(target, spec, sets[name][: spec.n_prompts], log=log)
            args.out.write_text(json.dumps(result, indent=2))
        del target
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
