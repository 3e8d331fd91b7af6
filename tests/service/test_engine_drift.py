"""Drift and fallback in `specops serve engine` (its own process, smollm2 with the builtin EAGLE
head, real NATS): chat traffic sets the head's baseline acceptance; the same tenant's traffic then
turns to "repeat this hex string" prompts, where the head's acceptance falls (0.17 on chat, 0.09
on these with the head shipped since 2026-11-27; bench/drift.py measures it); the server detects it within
N = WINDOW requests, publishes `spec.serve.<id>.drift_detected` with the numbers and sends the
key's requests to n-gram (every PROBE-th one still to the head); chat traffic again and the
probes bring it back (`drift_recovered`). Every response is the plain greedy text, whichever
method decoded it. Throughput per phase is bench/drift.py's (no timing here)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import httpx
import pytest
from fixtures import bus
from fixtures.engine import engine_server
from nats.js import JetStreamContext

from speccore.engine import Engine, Request
from speccore.models import LoadedModel
from specops_schemas.serve import DriftDetected, DriftRecovered
from specprompts.sets import load_prompts

# Five minutes on the 2-core host: make test-full runs it, make test does not.
pytestmark = [pytest.mark.slow, pytest.mark.long]

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 32
WINDOW = 4  # N: drift is detected within this many requests of the new traffic
BASELINE = 4  # W
PROBE = 2  # M
THRESHOLD = 0.6
RECOVER = 0.7
SERVER_ID = "drift-test"
HEADERS = {"X-Specops-Tenant": "acme", "X-Specops-Workload": "chat"}
_FINISHED = re.compile(r"finished \(\w+\) by (\w+) for tenant acme, workload chat")


def hex_prompt(seed: int) -> str:
    """A prompt the chat head drafts badly for and n-gram well: copy a random hex string."""
    rng = random.Random(seed)
    return "Repeat this string exactly: " + "".join(rng.choice("0123456789abcdef") for _ in range(48))


def _drift_events(url: str, kind: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        series = line.startswith("specops:spec_decode_drift_events_total{") and f'kind="{kind}"' in line
        if series and 'workload="chat"' in line:  # never per tenant
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _methods(log: Path) -> list[str]:
    """The method of each finished request of the key, in order (requests are sent one at a time)."""
    return _FINISHED.findall(log.read_text())


async def test_drift_to_ngram_and_back(
    js: JetStreamContext, nats_url: str, smollm: LoadedModel, tmp_path: Path
) -> None:
    chat = [p.text for p in load_prompts("chat", 16)]
    plain = Engine(smollm, "none")

    def expected(text: str) -> str:
        ids = smollm.encode_chat([{"role": "user", "content": text}])
        return plain.generate([Request(ids, MAX_TOKENS)])[0].text

    args = ["--model", MODEL, "--method", "eagle", "--head", "builtin:eagle", "--fallback", "ngram"]
    args += ["--drift-window", str(WINDOW), "--drift-baseline-requests", str(BASELINE)]
    args += ["--drift-probe-every", str(PROBE), "--drift-threshold", str(THRESHOLD)]
    args += ["--drift-recover", str(RECOVER), "--server-id", SERVER_ID, "--nats-url", nats_url]
    log = tmp_path / "engine.log"
    with engine_server(args, log) as engine:
        async with httpx.AsyncClient(base_url=engine.url, headers=HEADERS, timeout=120) as client:

            async def ask(text: str) -> None:
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
                r = await client.post(
                    "/v1/chat/completions", json=body | {"max_tokens": MAX_TOKENS, "temperature": 0}
                )
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == expected(text)

            # Chat: the baseline, then a full window of chat without a drift.
            for text in chat[: BASELINE + WINDOW]:
                await ask(text)
            assert _drift_events(engine.url, "detected") == 0
            assert _methods(log) == ["eagle"] * (BASELINE + WINDOW)

            # Hex: detected within WINDOW requests.
            sent = 0
            while _drift_events(engine.url, "detected") == 0:
                assert sent < WINDOW, f"no drift after {sent} hex requests"
                await ask(hex_prompt(sent))
                sent += 1
            detected_after = sent
            for i in range(2 * PROBE):
                await ask(hex_prompt(100 + i))
            after = _methods(log)[-2 * PROBE :]
            assert after == (["ngram"] * (PROBE - 1) + ["eagle"]) * 2, after
            assert _drift_events(engine.url, "recovered") == 0

            # Chat again: the probes recover within WINDOW of them.
            sent = 0
            while _drift_events(engine.url, "recovered") == 0:
                assert sent < PROBE * WINDOW + PROBE, f"no recovery after {sent} chat requests"
                await ask(chat[BASELINE + WINDOW + sent % (len(chat) - BASELINE - WINDOW)])
                sent += 1
            await ask(chat[0])
            assert _methods(log)[-1] == "eagle"

    detected, recovered = [
        (await bus.events(js, f"spec.serve.{SERVER_ID}.{kind}"))[0].payload
        for kind in ("drift_detected", "drift_recovered")
    ]
    assert isinstance(detected, DriftDetected) and isinstance(recovered, DriftRecovered)
    assert (detected.tenant, detected.workload, detected.method) == ("acme", "chat", "ngram")
    assert detected.primary_method == "eagle" and detected.window == WINDOW
    assert detected.current_acceptance < THRESHOLD * detected.baseline_acceptance
    assert recovered.method == "eagle" and recovered.baseline_acceptance == detected.baseline_acceptance
    assert recovered.current_acceptance >= RECOVER * recovered.baseline_acceptance
    print(
        f"drift detected after {detected_after} hex requests: acceptance {detected.current_acceptance:.3f} "
        f"vs baseline {detected.baseline_acceptance:.3f}; recovered at {recovered.current_acceptance:.3f}"
    )
