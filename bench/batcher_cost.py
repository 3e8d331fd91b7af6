"""What joining and leaving cost the continuous batcher at concurrency 32 (issue 19).

32 chat requests of 64-128 new tokens arrive staggered (``--per-step`` new ones before each
step) into ``ContinuousBatcher(max_rows=32)``; the script times every batcher step and, inside
it, the time spent moving rows in and out: the KV caches' ``take``/``concat`` (the target's
and a proposer's) and the proposer state's ``rows.take``/``rows.concat``. Prints one JSON
line: wall seconds, step seconds, join/leave seconds and their share, tokens per second.

    .venv/bin/python bench/batcher_cost.py [--method ngram] [--adaptive-k]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from speccore import rows
from speccore.batching import ContinuousBatcher
from speccore.engine import Engine, Request
from speccore.kv_cache import StaticKVCache
from speccore.models import load_model
from speccore.proposers.base import ProposerConfig

TEXTS = [
    "Write a python function that reverses a list.",
    "What is the capital of France? Explain its history.",
    "List the seven wonders of the ancient world, then describe each.",
    "Tell me a story about a cat who learns to fly.",
    "Explain TCP congestion control.",
    "Give me a recipe for pancakes.",
    "Summarise the plot of Hamlet.",
    "How do vaccines work?",
]


class Stopwatch:
    """Wraps functions so the time spent in them adds up (not re-entrant counts)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t0
                    self.calls += 1

        return timed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="none")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--head", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--adaptive-k", action="store_true")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--per-step", type=int, default=2, help="requests arriving before each step")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    target = load_model("smollm2-135m-instruct", device="cpu", dtype="float32")
    config = ProposerConfig(k=args.k, head=args.head, draft=args.draft)
    engine = Engine(target, args.method, config, adaptive=args.adaptive_k)
    moves = Stopwatch()
    StaticKVCache.take = moves.wrap(StaticKVCache.take)  # type: ignore[method-assign]
    StaticKVCache.concat = moves.wrap(StaticKVCache.concat)  # type: ignore[method-assign]
    rows.take = moves.wrap(rows.take)
    rows.concat = moves.wrap(rows.concat)

    prompts = [target.encode_prompt(TEXTS[i % len(TEXTS)], chat=True) for i in range(args.requests)]
    requests = [Request(ids, max_new_tokens=64 + (37 * i) % 65) for i, ids in enumerate(prompts)]
    batcher = ContinuousBatcher(engine, max_rows=32)
    pending = list(requests)
    steps, step_s, tokens, peak = 0, 0.0, 0, 0
    start = time.perf_counter()
    while pending or not batcher.idle:
        for r in pending[: args.per_step]:
            batcher.add(r)
        del pending[: args.per_step]
        t0 = time.perf_counter()
        report = batcher.step()
        step_s += time.perf_counter() - t0
        steps += 1
        peak = max(peak, batcher.running)
        tokens += sum(len(u.tokens) for u in report.updates)
    wall = time.perf_counter() - start
    print(
        json.dumps(
            {
                "method": args.method,
                "adaptive_k": args.adaptive_k,
                "requests": args.requests,
                "steps": steps,
                "peak_rows": peak,
                "tokens": tokens,
                "wall_s": round(wall, 2),
                "step_s": round(step_s, 2),
                "join_leave_s": round(moves.seconds, 2),
                "join_leave_calls": moves.calls,
                "join_leave_share": round(moves.seconds / step_s, 3),
                "tokens_per_s": round(tokens / wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
