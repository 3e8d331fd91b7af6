"""What one verify block costs on this host, by its size, as a chain and as a tree.

A speculative step scores the pending token and every draft node in one forward pass over
the committed context, so how a step's time grows with its block decides how long a draft
may be before it costs more than it saves (copy-based drafts vary from 0 to k nodes a
step). Also the prefill of the context, which every method pays once per request.

Per block size: the median of ``--reps`` forward passes at a context of ``--context``
tokens (random token ids; the cost does not depend on them), sizes interleaved, after a
warm-up round and an untimed prefill. A tree block is two branches from the pending token
(a node's parent two nodes back), the shape a merged suffix draft or a 2-wide EAGLE tree
takes.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/verify_cost.py \\
        --out bench/results/verify-cost-smollm2-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import machine

from speccore.models import load_model
from speccore.runner import ModelRunner

SIZES = (1, 2, 4, 6, 8, 12, 16)


def two_branches(q: int) -> torch.Tensor:
    """Block-relative parents of a q-token block: the pending token, then two branches."""
    return torch.tensor([[-1] + [max(0, i - 2) for i in range(1, q)]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model)
    runner = ModelRunner(target.model)
    cache = runner.new_cache(1, args.context + max(SIZES) + 1)
    context = torch.randint(100, 10_000, (1, args.context))
    runner.forward(runner.new_cache(1, args.context), context)  # the first pass sets kernels up
    started = time.perf_counter()
    runner.forward(cache, context)
    prefill_s = time.perf_counter() - started
    cache.commit(torch.tensor([args.context]))
    seconds: dict[tuple[int, str], list[float]] = {}
    for rep in range(args.reps + 1):  # round 0 warms up
        for q in SIZES:
            for shape, parents in (("chain", None), ("tree", two_branches(q))):
                tokens = torch.randint(100, 10_000, (1, q))
                started = time.perf_counter()
                runner.forward(cache, tokens, parents)  # written after the context, never committed
                if rep:
                    seconds.setdefault((q, shape), []).append(time.perf_counter() - started)
    rows = [
        {"block_tokens": q, "shape": shape, "ms_median": round(1000 * statistics.median(v), 2)}
        for (q, shape), v in seconds.items()
    ]
    one = next(r["ms_median"] for r in rows if r["block_tokens"] == 1 and r["shape"] == "chain")
    for row in rows:
        row["vs_one_token"] = round(row["ms_median"] / one, 3)
    result = {
        "model": args.model,
        "machine": machine(),
        "context_tokens": args.context,
        "reps": args.reps,
        "prefill_ms": round(1000 * prefill_s, 1),
        "blocks": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        q, shape, ms, ratio = row["block_tokens"], row["shape"], row["ms_median"], row["vs_one_token"]
        print(f"{q:3d} {shape:5s} {ms:7.2f} ms  {ratio:.2f}x")
    print(f"prefill of {args.context} tokens: {result['prefill_ms']} ms; wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
