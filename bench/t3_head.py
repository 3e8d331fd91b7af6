"""A T3 head trained as a user trains one, against a running stack (`specops up`), and what T1
then makes of it.

1. A fresh tenant with a developer's and a head reviewer's token (issued straight into the
   stack's database, as bench/t1_latency.py does).
2. The training and held-out JSONL uploaded (`POST heads/data`; by default the ShareGPT
   exchanges self-distilled by smollm2 that ship in artifacts/heads/), a head submitted
   (`POST heads/train`), its epochs printed as the head-trainer announces them.
3. The quality gate's verdict on the held-out prompts (lossless, acceptance, speedup over
   `none`); a validated head is moved to uat (developer) and production (head reviewer).
4. A T1 run of the tenant on chat: which of the head's candidates it listed, measured and
   gated, and what it chose. The head is then deprecated.
5. Everything as JSON (--out): the curve, the gate's numbers, the T1 rows, wall-clock times.

    .venv/bin/python bench/t3_head.py --epochs 4 --out bench/results/t3-medusa-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from common import fresh_token, machine

from specops.client import SpeculativeClient, default_url
from specops_schemas.catalog import Role
from specops_schemas.heads import HeadResponse
from specplatform.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "artifacts" / "heads" / "smollm2-135m-instruct" / "data"
MODEL = "smollm2-135m-instruct"
TARGET = {"model_ref": MODEL, "gpu": "cpu", "engine": "speccore"}
TIMEOUT_S = 3600.0


def follow(client: SpeculativeClient, head_id: str) -> HeadResponse:
    """Poll the head until it leaves `training`, printing each new epoch."""
    shown = 0
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        head = client.heads.get(head_id)
        for epoch in head.epochs[shown:]:
            loss = "untrained" if epoch.train_loss is None else f"loss {epoch.train_loss:.4f}"
            held = ", ".join(f"{k} {v:.3f}" for k, v in epoch.heldout.items())
            print(
                f"  epoch {epoch.epoch}: {loss}, {epoch.tokens_seen} tokens; held-out {held}", file=sys.stderr
            )
        shown = len(head.epochs)
        if head.state != "training":
            return head
        if time.monotonic() > deadline:
            raise TimeoutError(f"head {head_id} still training after {TIMEOUT_S:g} s")
        time.sleep(5.0)


def t1_rows(run: Any, head_id: str) -> dict[str, Any]:
    rows = [c for c in run.candidates if c.candidate.draft == head_id]
    return {
        "run_id": run.id,
        "winner": run.winner.candidate.candidate_id if run.winner else None,
        "winner_speedup": run.winner.measurement.speedup if run.winner and run.winner.measurement else None,
        "head_candidates_listed": len(rows),
        "head_candidates": [
            {
                "candidate_id": c.candidate.candidate_id,
                "predicted_speedup": c.prediction.speedup,
                "measured_speedup": c.measurement.speedup if c.measurement else None,
                "acceptance_rate": c.measurement.acceptance_rate if c.measurement else None,
                "gate_passed": c.gate.passed if c.gate else None,
            }
            for c in rows
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", default="medusa", choices=("medusa", "eagle", "eagle3"))
    parser.add_argument("--train", type=Path, default=DATA / "train.jsonl")
    parser.add_argument("--heldout", type=Path, default=DATA / "heldout.jsonl")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--n-prompts", type=int, default=8, help="held-out prompts the gate decodes")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--min-acceptance", type=float, default=0.2)
    parser.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    parser.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    url = args.url or default_url()
    dsn = args.database_url or load_settings().require_database_url()
    tenant = f"t3-bench-{uuid.uuid4().hex[:12]}"
    dev = fresh_token(dsn, "t3-bench", name="bench/t3_head.py", tenant=tenant)
    reviewer = fresh_token(dsn, "t3-bench", name="bench/t3_head.py", role=Role.HEAD_REVIEWER, tenant=tenant)
    before = machine()
    with SpeculativeClient(url, dev) as client, SpeculativeClient(url, reviewer) as reviewing:
        train = client.heads.upload(args.train)
        heldout = client.heads.upload(args.heldout)
        print(f"uploaded {train.examples} training and {heldout.examples} held-out examples", file=sys.stderr)
        start = time.monotonic()
        head = client.heads.submit(
            target=MODEL,
            family=args.family,
            train_data=train.sha256,
            heldout_data=heldout.sha256,
            epochs=args.epochs,
            gate={
                "min_acceptance": args.min_acceptance,
                "n_prompts": args.n_prompts,
                "max_new_tokens": args.max_new_tokens,
                "reps": args.reps,
            },
        )
        print(f"head {head.id}: training", file=sys.stderr)
        head = follow(client, head.id)
        trained_s = time.monotonic() - start
        print(
            f"head {head.id}: {head.state} after {trained_s:.0f} s ({head.error or head.gate.reason})",
            file=sys.stderr,
        )
        t1 = None
        if head.state == "validated":
            client.heads.transition(head.id, "uat")
            reviewing.heads.transition(head.id, "production", "bench/t3_head.py: gated on the held-out set")
            run = client.runs.wait(client.runs.create(target=TARGET, workload="chat").id, timeout=TIMEOUT_S)
            t1 = t1_rows(run, head.id)
            print(
                f"T1 run {run.id}: winner {t1['winner']}; head rows {t1['head_candidates']}", file=sys.stderr
            )
            head = client.heads.transition(head.id, "deprecated", "bench/t3_head.py: measured, retired")
    result = {
        "command": " ".join(["python", *sys.argv]),
        "target": MODEL,
        "family": args.family,
        "train_examples": train.examples,
        "heldout_examples": heldout.examples,
        "head": head.model_dump(mode="json"),
        "submit_to_verdict_s": round(trained_s, 1),
        "t1": t1,
        "machine_before": before,
        "machine_after": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if head.state in ("validated", "deprecated") else 1


if __name__ == "__main__":
    sys.exit(main())
