"""`make demo`: a T1 run through the services on this machine, as a user would do it.

1. `specops up`: embedded NATS and PostgreSQL, then gateway, predictor, benchmark-runner,
   quality-gate and audit, each its own process.
2. `specops tokens create`: a developer token for a new demo tenant (so the winner cache
   starts empty and the run is really measured), saved as this machine's default token
   (`<state dir>/token`), so `specops run` and the SDK work without --token afterwards.
3. A T1 run for smollm2-135m-instruct / chat / cpu / speccore through the SDK, its events
   streamed as they happen, then the winner and candidates tables.
4. The same request again: answered from the winner cache, `cache_hit=true`, with its latency.
5. The winner's flags and launch commands for speccore and for vLLM (`specops apply --run ID`).

`--fingerprint` picks another workload (default chat). The services keep running
afterwards (`specops status`; `specops down` stops them), unless `--down` is given.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

import httpx

from specops.client import Run, SpecopsAPIError, SpeculativeClient, save_token
from specops.commands.apply import apply_text, apply_view
from specops.commands.run import describe_event, run_tables
from specops_schemas.catalog import Fingerprint

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
WORKLOAD = "chat"
GOAL = {"quality_gate": "topk5"}
READY_TIMEOUT_S = 180.0


def specops(*args: str, capture: bool = False) -> str:
    """Run one `specops` command as a user would, echoing it; its stdout when `capture`."""
    print(f"\n$ {shlex.join(['specops', *args])}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "specops.cli", *args], stdout=subprocess.PIPE if capture else None, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"demo: `{shlex.join(['specops', *args])}` failed with exit code {done.returncode}")
    return done.stdout if capture else ""


def wait_ready(url: str) -> None:
    """The gateway answers /readyz once it reaches Postgres and NATS (its first start migrates)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise SystemExit(
        f"demo: the gateway at {url} is not ready after {READY_TIMEOUT_S:g} s; see `specops status`"
    )


def t1_run(client: SpeculativeClient, fingerprint: str) -> Run:
    model, gpu, engine = TARGET["model_ref"], TARGET["gpu"], TARGET["engine"]
    print(f"\nT1 run: {model} / {fingerprint} / {gpu} / {engine} via {client.base_url}")
    print("(the benchmark-runner and quality-gate load the model first; on a CPU this takes minutes)")
    start = time.monotonic()
    run = client.runs.create(target=TARGET, workload=fingerprint, mode="interactive", goal=GOAL)
    for event in client.runs.stream(run.id):
        print(f"[{time.monotonic() - start:6.1f}s] {describe_event(event)}", flush=True)
    final = client.runs.get(run.id)
    print()
    print(run_tables(final))
    return final


def cache_hit(client: SpeculativeClient, fingerprint: str) -> None:
    print("\nThe same request again:")
    start = time.monotonic()
    again = client.runs.create(target=TARGET, workload=fingerprint, mode="interactive", goal=GOAL)
    latency_ms = (time.monotonic() - start) * 1000
    winner = again.winner.candidate.candidate_id if again.winner is not None else "none"
    print(
        f"run {again.id}: {again.status}, cache_hit={str(again.cache_hit).lower()} "
        f"in {latency_ms:.0f} ms (winner {winner})"
    )


def apply_flags(client: SpeculativeClient, run: Run) -> None:
    print("\nApply the winner:")
    if run.winner is None:
        print(
            "no winner: no candidate that passed the gate beat plain decoding here, so plain decoding "
            "stays (try `--fingerprint code`, where prompt lookup usually wins on a CPU)"
        )
        return
    for engine in ("speccore", "vllm"):
        try:
            print(apply_text(apply_view(client.runs.apply(run.id, engine=engine), TARGET["model_ref"])))
        except SpecopsAPIError as exc:
            print(f"{engine}: {exc.detail or exc}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--down", action="store_true", help="stop the services and servers at the end")
    parser.add_argument("--fingerprint", default=WORKLOAD, choices=list(Fingerprint), help="default chat")
    args = parser.parse_args()

    specops("up")
    tenant = time.strftime("demo-%Y%m%d-%H%M%S")
    created = specops(
        "tokens", "create", "--tenant", tenant, "--role", "developer", "--name", "make demo", "--json",
        capture=True,
    )  # fmt: skip
    issued = json.loads(created)
    saved = save_token(issued["token"])
    print(f"token {issued['id']} (tenant {tenant}, developer) saved to {saved}")

    with SpeculativeClient(token=issued["token"]) as client:
        wait_ready(client.base_url)
        run = t1_run(client, args.fingerprint)
        if run.status != "completed":
            print("\nthe run failed; `specops status` lists the services' logs")
            return 1
        cache_hit(client, args.fingerprint)
        apply_flags(client, run)

    if args.down:
        specops("down")
    else:
        print(
            "\nThe services keep running: `specops status` lists them, `specops run --model "
            "smollm2-135m-instruct --gpu cpu --engine speccore --fingerprint code` starts another run, "
            "and `specops down` stops everything."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
