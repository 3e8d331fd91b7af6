"""`make attack`: attacks replayed against a live stack and engine server; each must hold.

One `specops up` on a scratch state dir (real NATS, PostgreSQL, the services as their own
processes, the real 135M model; bench/live_stack.py) and one `specops serve engine` on the
same model (suffix drafting, drift control on, every tenant in the `shared` tier), then one
attack after another. Each is independent: one that fails or raises is recorded and the
next runs. A row says what was expected, what was observed and whether it held; the rows
are written to --out after each attack, and docs/results/attack.md is generated from them.
The exit status is 1 when any attack did not hold. The attacks live beside it, registered
with `attack_kit.attack`: attacks_engine.py, attacks_bus.py (audit, NATS), attacks_gateway.py.

Issue 41's findings (the behaviour its fixes promise) and the earlier round's attacks:

- engine-body-limit: a 20 MB /v1/completions body is a 413 within 3 s, RSS within 100 MB;
- engine-tenant-claim: a bare X-Specops-Tenant claim, unsigned, is refused (401/403);
- audit-tail-delete / audit-rewrite: the newest rows deleted with the chain head moved back,
  or one row's content rewritten with the chain recomputed, fail `audit verify --against-stream`;
- intake-dedup: tenant B's intake message with tenant A's Nats-Msg-Id is accepted as B's run;
- storage-quota: one developer's datastore uploads are refused (413/429) at the quota;
- model-ref-probe: server paths as model_ref are refused alike, existing or not;
- dlq-show-nested: `specops dlq show` on a 100000-deep parked message exits 0;
- postgres-recovery: the gateway answers 200 within 5 s after PostgreSQL is back;
- console-sign-out: the session cookie is no API token and is refused after sign-out;
- metrics-tenant-labels: no tenant name is a label value on the engine's or gateway's /metrics;
- budgets: budgets of 1e30 (and infinity) are 4xx problems;
- forged-events, anonymous-nats, cross-tenant-reads, poison, api-abuse: the earlier round's.

    .venv/bin/python bench/attack.py --out bench/results/attack.json
    .venv/bin/python bench/attack.py --only intake-dedup   # rerun one; the other rows are kept
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import attacks_bus  # noqa: F401  # registers its attacks
from attack_kit import (
    ATTACKS,
    Attack,
    Outcome,
    Target,
    short,
)
from attacks_engine import engine
from attacks_gateway import OUTAGE_S
from live_stack import (
    log,
    stack,
)

from specops.runtime.supervisor import SERVICES

# Issue 41's findings, then the earlier round's; PostgreSQL's outage last: it stops the
# watcher (`specops up` starts both again).
ORDER = [
    "engine-body-limit", "engine-tenant-claim", "metrics-tenant-labels", "audit-tail-delete",
    "audit-rewrite", "intake-dedup", "storage-quota", "model-ref-probe", "dlq-show-nested",
    "console-sign-out", "budgets", "forged-events", "anonymous-nats", "cross-tenant-reads", "poison",
    "api-abuse", "postgres-recovery",
]  # fmt: skip


def play(target: Target, attack: Attack) -> Outcome:
    log(f"=== {attack.name}")
    begin = time.monotonic()
    try:
        observed, held = attack.run(target)
    except Exception as exc:  # noqa: BLE001 - one attack's failure is its row; the next runs
        traceback.print_exc()
        observed, held = f"the attack failed: {type(exc).__name__}: {short(str(exc), 300)}", False
    outcome = Outcome(attack.name, attack.expected, observed, held, round(time.monotonic() - begin, 1))
    log(f"{attack.name}: {'held' if held else 'NOT HELD'}: {observed}")
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/attack.json"))
    parser.add_argument("--page", type=Path, default=Path("docs/results/attack.md"))
    parser.add_argument("--postgres-outage-s", type=float, default=OUTAGE_S)
    parser.add_argument("--engine-args", default="", help="more options of `specops serve engine`")
    parser.add_argument("--only", nargs="*", choices=ORDER, help="attack names to play (default: all)")
    args = parser.parse_args()
    # A stopped suite still takes its stack and engine down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [ATTACKS[name] for name in ORDER if not args.only or name in args.only]
    outcomes: list[Outcome] = []
    begin = time.monotonic()
    keep = os.environ.get("SPECOPS_ATTACK_KEEP") == "1"
    with (
        stack(dict.fromkeys(SERVICES, 1), prefix="attack", keep=keep) as running,
        engine(running.root, shlex.split(args.engine_args)) as (url, pid),
    ):
        target = Target(running, url, pid, args.postgres_outage_s)
        for attack in chosen:
            outcomes.append(play(target, attack))
            write(args, outcomes, time.monotonic() - begin)
    failed = [o.name for o in outcomes if not o.held]
    log(f"done in {time.monotonic() - begin:.0f} s; " + (f"NOT held: {failed}" if failed else "all held"))
    return 1 if failed else 0


def write(args: argparse.Namespace, outcomes: list[Outcome], elapsed_s: float) -> None:
    """The rows, each with when and how it was produced, and the results page made from them."""
    produced = {
        "date": dt.date.today().isoformat(),
        "command": "make attack",
        "host": f"{platform.machine()}, {os.cpu_count()} cpus",
        "suite_elapsed_s": round(elapsed_s, 1),
    }
    rows = [asdict(o) | produced for o in outcomes]
    if args.only and args.out.exists():
        # A rerun of some attacks replaces their rows and keeps the others'.
        replaced = {row["name"] for row in rows}
        rows = [row for row in json.loads(args.out.read_text()) if row["name"] not in replaced] + rows
        rows.sort(key=lambda row: ORDER.index(row["name"]) if row["name"] in ORDER else len(ORDER))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page(rows, args.out))


def page(rows: list[dict[str, Any]], out: Path) -> str:
    """docs/results/attack.md: the rows as a table, with when, where and how they were measured."""
    dates = ", ".join(sorted({row["date"] for row in rows}))
    host = rows[0]["host"] if rows else "-"
    held = sum(row["held"] for row in rows)
    lines = [
        "# Attacks",
        "",
        f"**Measured:** {dates}, {host}.  ",
        f"**Reproduce:** `make attack` (`bench/attack.py --out {out}`); one attack alone, keeping the "
        "other rows: `bench/attack.py --only NAME`  ",
        f"**Results:** `{out}` (in the repository).",
        "",
        "Generated by `bench/attack.py` from its results; do not edit by hand.",
        "",
        "One `specops up` on a scratch state dir (real NATS, PostgreSQL, the services as processes, "
        "the 135M model) and one `specops serve engine` (suffix, drift control on, every tenant in the "
        "`shared` tier); each attack uses fresh tenants of its own. Issue 41's findings come first, "
        "PostgreSQL's outage last (it stops the watcher), the earlier round's attacks between.",
        "",
        f"{held} of {len(rows)} held.",
        "",
        "| attack | expected | observed | held |",
        "|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"`{row['name']}`", row["expected"], row["observed"], "yes" if row["held"] else "**no**"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
