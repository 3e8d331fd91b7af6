"""`make demo` until the services exist: speccore on a real model, plain vs speculative.

Runs one HumanEval prompt with every speculative family, checks each output is
token-identical to plain greedy decoding, and prints a winner table.
"""

from __future__ import annotations

import sys

import torch

from speccore.engine import Engine, Request
from speccore.models import load_model
from speccore.prompts import humaneval_prompts
from speccore.proposers import DEFAULT_K
from speccore.proposers.base import ProposerConfig

MODEL = "smollm2-135m-instruct"
METHODS = {
    "none": ProposerConfig(),
    "ngram": ProposerConfig(k=DEFAULT_K["ngram"]),
    "lookahead": ProposerConfig(k=DEFAULT_K["lookahead"]),
    "draft_model": ProposerConfig(k=DEFAULT_K["draft_model"], draft="self:12"),
}


def main() -> int:
    torch.set_num_threads(2)
    print(f"loading {MODEL} (the first load dequantizes the GGUF and caches it) ...", file=sys.stderr)
    target = load_model(MODEL)
    prompt = humaneval_prompts(1, seed=3)[0]
    ids = target.encode_prompt(prompt.text, chat=False)
    print(f"prompt {prompt.id} ({len(ids)} tokens):\n{prompt.text}")
    rows = []
    baseline: list[int] | None = None
    for method, cfg in METHODS.items():
        engine = Engine(target, method, cfg)
        engine.generate([Request(ids[:32], 8)])  # warm-up
        gen = engine.generate([Request(ids, 128)])[0]
        baseline = baseline if baseline is not None else gen.token_ids
        m = gen.metrics
        rows.append(
            (method, m.tokens_per_s, m.mean_acceptance_length, m.acceptance_rate, gen.token_ids == baseline)
        )
        if method == "none":
            print(f"completion:\n{gen.text}\n")
    base_tps = rows[0][1]
    print(f"{'method':12} {'tok/s':>7} {'speedup':>8} {'MAL':>5} {'accept':>7} identical-to-greedy")
    for method, tps, mal, acc, same in rows:
        print(f"{method:12} {tps:7.1f} {tps / base_tps:7.2f}x {mal:5.2f} {acc:7.2f} {same}")
    winner = max(rows, key=lambda r: r[1] if r[4] else 0.0)
    print(f"\nwinner: {winner[0]} ({winner[1] / base_tps:.2f}x plain decoding, lossless)")
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
