"""The engine server's detokenizer, measured: (a) its cost per output token at 256 / 1k / 2k /
4k tokens, the tokenizer alone (one token fed at a time, as the worker feeds a plain decode);
(b) TPOT at 2k output tokens through a real `specops serve engine` (smollm2, no speculation,
greedy), streamed, from the first content chunk to the last.

Each run is stored under its ``--label`` (``before``, ``after``) in the results file, so one
file holds both sides of a change:

    python bench/detok.py --label after   # -> bench/results/detok-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import machine
from transformers import AutoTokenizer

from speccore.detokenize import IncrementalText
from speccore.models import engine_checkpoint
from specops.runtime.ports import free_port

MODEL = "smollm2-135m-instruct"
LENGTHS = (256, 1024, 2048, 4096)
SERVED_TOKENS = 2048
RESULTS = Path(__file__).parent / "results" / "detok-cpu2.json"
# Mixed text (ASCII, code, CJK, emoji) so that some tokens end inside a character.
TEXT = (
    "The quick brown fox 🦊 jumps over the lazy dog. 東京は日本の首都です。"
    "def f(x):\n    return x * 2  # ünïcödé ✓\n"
    "Ça coûte 12,50 € — naïve café. 😀👍🏽 한국어 텍스트. "
)
# A prompt that smollm2 answers at length without an end of sequence for 2k tokens.
PROMPT = "Count from 1 to 2000, one number per line:\n1\n2\n3\n4\n5\n"


def per_token_cost(tokenizer: Any, length: int, rounds: int) -> float:
    """Microseconds per token of feeding ``length`` ids one at a time (best of ``rounds``)."""
    ids: list[int] = []
    while len(ids) < length:
        ids += tokenizer(TEXT, add_special_tokens=False).input_ids
    ids = ids[:length]
    best = float("inf")
    for _ in range(rounds):
        text = IncrementalText(tokenizer)
        start = time.perf_counter()
        out = [text.feed([i]) for i in ids[:-1]]
        out.append(text.feed(ids[-1:], final=True))
        best = min(best, time.perf_counter() - start)
        assert "".join(out) == tokenizer.decode(ids, skip_special_tokens=True)
    return best / length * 1e6


def served_tpot(log: Path) -> dict[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "specops.cli", "serve", "engine", "--model", MODEL, "--method", "none"]
    cmd += ["--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _healthy(url):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the engine did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": SERVED_TOKENS, "temperature": 0}
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        stamps: list[float] = []
        tokens = 0
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
        return {
            "completion_tokens": tokens,
            "tpot_ms": (stamps[-1] - stamps[0]) / max(tokens - 1, 1) * 1e3,
            "e2e_s": stamps[-1] - stamps[0],
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--label", required=True, help="the side of the change measured (before, after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-server", action="store_true", help="the tokenizer-only part only")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(engine_checkpoint(MODEL))
    run: dict[str, Any] = {
        "machine": machine(),
        "us_per_token": {str(n): round(per_token_cost(tokenizer, n, args.rounds), 2) for n in LENGTHS},
    }
    print(json.dumps(run["us_per_token"]))
    if not args.skip_server:
        run["served"] = served_tpot(Path(tempfile.gettempdir()) / f"detok-{args.label}.log")
        print(json.dumps(run["served"]))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = run
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
