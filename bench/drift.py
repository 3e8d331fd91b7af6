"""Throughput per phase of the drift test's traffic (tests/service/test_engine_drift.py): the
engines the server runs with `--method eagle --head builtin:eagle --fallback auto`, over one
target, driven through the server's ContinuousBatcher one request at a time (concurrency 1, as
the test sends them), each request naming its method as the server's worker does.

Phases (traffic / method): chat / eagle (before the drift), hex / eagle (the head on drifted
traffic), hex / ngram (the fallback), hex / none (plain decoding), and chat / ngram and
chat / none, where n-gram accepts little: the break-even of `--fallback auto`. Each rep runs
every phase once, in an order rotated per rep (interleaved), after one warm-up pass; the result
is the median tokens/s over reps, acceptance and mean acceptance length per phase, and the
ratios the issue asks for (fallback / plain on the drifted traffic), each the median over reps
of the two phases' ratio within a rep.

    .venv/bin/python bench/drift.py --reps 5 --out bench/results/drift-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import machine

from speccore.batching import ContinuousBatcher
from speccore.engine import Engine, Request
from speccore.models import load_model
from speccore.proposers import ProposerConfig, default_k
from specprompts.sets import load_prompts

MODEL = "smollm2-135m-instruct"


def hex_prompt(seed: int) -> str:
    """The drifted traffic, as tests/service/test_engine_drift.py sends it: copy a random hex string."""
    rng = random.Random(seed)
    return "Repeat this string exactly: " + "".join(rng.choice("0123456789abcdef") for _ in range(48))


PHASES = [
    ("chat", "eagle"),
    ("hex", "eagle"),
    ("hex", "ngram"),
    ("hex", "none"),
    ("chat", "ngram"),
    ("chat", "none"),
]


def run_phase(
    batcher: ContinuousBatcher, prompts: list[list[int]], method: str, max_tokens: int
) -> dict[str, float]:
    """The prompts one after another through the batcher; tokens/s over the phase's wall time."""
    tokens = drafted = accepted = drafts = 0
    start = time.perf_counter()
    for ids in prompts:
        batcher.add(Request(ids, max_tokens), method)
        while not batcher.idle:
            for u in batcher.step().updates:
                if u.finished and u.generation is not None:
                    m = u.generation.metrics
                    tokens += len(u.generation.token_ids)
                    drafted += m.drafted_tokens
                    accepted += m.accepted_tokens
                    drafts += m.drafted_per_position[0] if m.drafted_per_position else 0
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "acceptance": accepted / drafted if drafted else 0.0,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=6, help="prompts per phase")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench/results/drift-cpu2.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(MODEL, device="cpu", dtype="float32")
    engines = {
        "eagle": Engine(target, "eagle", ProposerConfig(k=default_k("eagle"), head="builtin:eagle")),
        "ngram": Engine(target, "ngram", ProposerConfig(k=default_k("ngram"))),
        "none": Engine(target, "none"),
    }
    batcher = ContinuousBatcher(engines, max_rows=32)
    chat = [p.text for p in load_prompts("chat", args.prompts, seed=1)]
    texts = {"chat": chat, "hex": [hex_prompt(1000 + i) for i in range(args.prompts)]}
    prompts = {k: [target.encode_chat([{"role": "user", "content": t}]) for t in v] for k, v in texts.items()}

    for traffic, method in PHASES:  # warm-up
        run_phase(batcher, prompts[traffic][:1], method, args.max_tokens)
    runs: dict[str, list[dict[str, float]]] = {f"{t}/{m}": [] for t, m in PHASES}
    for rep in range(args.reps):
        order = PHASES[rep % len(PHASES) :] + PHASES[: rep % len(PHASES)]
        for traffic, method in order:
            r = run_phase(batcher, prompts[traffic], method, args.max_tokens)
            runs[f"{traffic}/{method}"].append(r)
            print(
                f"rep {rep} {traffic}/{method}: {r['tokens_per_s']:.1f} tok/s, "
                f"acceptance {r['acceptance']:.3f}",
                flush=True,
            )

    phases = {
        name: {
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
            "tokens_per_s": [round(r["tokens_per_s"], 2) for r in rs],
            "acceptance": rs[0]["acceptance"],  # greedy: the same every rep
            "mean_acceptance_length": rs[0]["mean_acceptance_length"],
            "tokens": rs[0]["tokens"],
        }
        for name, rs in runs.items()
    }

    def ratio(a: str, b: str) -> float:
        """The median over reps of the rep's ratio: both phases ran in the same rep, so a load
        that slows one rep slows both."""
        return statistics.median(
            x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[a], runs[b], strict=True)
        )

    result: dict[str, Any] = {
        "what": "tokens/s per phase of the drift test's traffic, concurrency 1, greedy (bench/drift.py)",
        "command": " ".join(["bench/drift.py", *sys.argv[1:]]),
        "model": MODEL,
        "primary": "eagle builtin:eagle",
        "prompts_per_phase": args.prompts,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "threads": args.threads,
        "phases": phases,
        "ratios": {
            "fallback_ngram_over_plain_on_drifted": ratio("hex/ngram", "hex/none"),
            "primary_over_plain_on_drifted": ratio("hex/eagle", "hex/none"),
            "fallback_ngram_over_primary_on_drifted": ratio("hex/ngram", "hex/eagle"),
            "primary_over_plain_on_chat": ratio("chat/eagle", "chat/none"),
            "ngram_over_plain_on_chat": ratio("chat/ngram", "chat/none"),
        },
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
