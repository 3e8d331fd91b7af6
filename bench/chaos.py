"""`make chaos`: faults injected into a live stack with runs in flight; nothing may be lost,
done twice or left stuck.

One `specops up` on a scratch state dir (real NATS, PostgreSQL, the services as their own
processes, the real 135M model, benches and gates shrunk by settings), then one scenario
after another, each with --runs runs of fresh tenants in flight when its fault hits:

- kill-<service>: kill -9 of one service process mid-run (the runtime's watcher restarts it);
- kill-nats: kill -9 of nats-server (restarted on the same port by the watcher);
- postgres-outage: PostgreSQL stopped for --postgres-outage-s (default 300), then `specops up`;
- poison: nested, oversized, invalid-JSON, unknown-type, wrong-schema-version and
  unknown-tenant messages published next to the runs: each must be parked once per
  service that consumes it, and nothing else disturbed;
- kill-replicas: two replicas of the benchmark runner killed alternately, three kills.

After each fault one more run is submitted (new work must flow too), then every run is
waited for. Per scenario: submitted, completed, failed (with the run's own reason), lost
(accepted but unknown to the gateway, or never on the stream), duplicated (more than
one terminal event, or one message id twice on the stream), stuck (not terminal after
--run-timeout-s), max_recovery_s (fault cleared -> every component healthy in
`specops status` and every run in flight moved on). Written to --out after each
scenario; the exit status is 1 when any lost/duplicated/stuck is not 0.

    .venv/bin/python bench/chaos.py --out bench/results/chaos.json
    .venv/bin/python bench/chaos.py --only kill-nats   # rerun one; the other rows are kept
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from live_stack import (
    TARGET,
    Stack,
    StreamMessage,
    log,
    poison_messages,
    publish_as_admin,
    stack,
    stop_watcher,
    stream_messages,
    utc_now,
    wait_parked,
)

from specops.client import SpecopsAPIError, SpecopsError, SpeculativeClient
from specops.runtime import postgres_server
from specops.runtime.state import StateDir
from specops.runtime.supervisor import SERVICES, status, up
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token

TERMINAL = ("completed", "failed")
POLL_S = 1.0
# The event whose first appearance on any run in flight means "mid-run" for a service's kill.
MID_RUN = {
    "predictor": "run.queued",
    "benchmark-runner": "bench.requested",
    "quality-gate": "bench.completed",
    "audit": "run.queued",
    "gateway": "run.predicted",
}
REPLICATED = "benchmark-runner"


@dataclass
class Result:
    """One row of bench/results/chaos.json."""

    scenario: str
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    max_recovery_s: float | None = None
    duration_s: float = 0.0
    failures: list[dict[str, str]] = field(default_factory=list)
    """Each failed run's error stage and message, as the user reads them."""
    parked: dict[str, dict[str, int]] = field(default_factory=dict)
    """poison only: message -> {service: letters}."""
    park_errors: dict[str, str] = field(default_factory=dict)
    """poison only: message -> the error its dead letter gives."""
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.lost == self.duplicated == self.stuck == 0


# --- runs ------------------------------------------------------------------------------


def tokens(stack: Stack, scenario: str, count: int) -> list[str]:
    async def issue() -> list[str]:
        return [
            (
                await issue_token(stack.database_url, tenant_id=f"chaos-{scenario}-{i}", role=Role.DEVELOPER)
            ).secret
            for i in range(count)
        ]

    return asyncio.run(issue())


def submit(stack: Stack, secrets: Sequence[str]) -> list[tuple[str, str]]:
    """One run per tenant token, created at once; (run id, token) of each accepted one."""

    def create(secret: str) -> tuple[str, str]:
        with SpeculativeClient(stack.url, secret) as client:
            run = client.runs.create(target=TARGET, workload="chat", goal={"quality_gate": "topk5"})
            return run.id, secret

    with ThreadPoolExecutor(len(secrets)) as pool:
        return list(pool.map(create, secrets))


def run_status(stack: Stack, run_id: str, secret: str) -> dict[str, Any] | None:
    """GET runs/{id} as a dict; None when the gateway does not know it (404)."""
    with SpeculativeClient(stack.url, secret) as client:
        try:
            return client.runs.get(run_id).model_dump(mode="json")
        except SpecopsAPIError as exc:
            if exc.status == 404:
                return None
            raise


def event_types(stack: Stack, run_ids: Sequence[str]) -> dict[str, list[tuple[str, dt.datetime]]]:
    """run id -> its (type, occurred_at) in the gateway's read model; {} while Postgres is down."""
    try:
        with psycopg.connect(stack.database_url, autocommit=True, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT run_id, type, occurred_at FROM run_events WHERE run_id = ANY(%s) ORDER BY seq",
                (list(run_ids),),
            ).fetchall()
    except psycopg.Error:
        return {}
    found: dict[str, list[tuple[str, dt.datetime]]] = {}
    for run_id, kind, at in rows:
        found.setdefault(str(run_id), []).append((kind, at))
    return found


def wait_for_event(stack: Stack, run_ids: Sequence[str], kind: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(kind == k for events in event_types(stack, run_ids).values() for k, _ in events):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no {kind} on runs {list(run_ids)} after {timeout_s:g} s")


def wait_recovered(
    stack: Stack, run_ids: Sequence[str], since: dt.datetime, timeout_s: float
) -> float | None:
    """Seconds from `since` until every component is healthy and every run in flight then moved on."""
    while (utc_now() - since).total_seconds() < timeout_s:
        events = event_types(stack, run_ids)
        moved = events and all(
            any(at > since or kind in ("run.completed", "run.failed") for kind, at in events.get(r, []))
            for r in run_ids
        )
        if moved and stack.healthy():
            return round((utc_now() - since).total_seconds(), 1)
        time.sleep(POLL_S)
    return None


def settle(
    stack: Stack, runs: Sequence[tuple[str, str]], timeout_s: float
) -> dict[str, dict[str, Any] | None]:
    """Wait until every run is terminal (or `timeout_s`); run id -> its last GET (None: 404)."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, dict[str, Any] | None] = {}
    pending = dict(runs)
    while pending and time.monotonic() < deadline:
        for run_id, secret in list(pending.items()):
            try:
                last[run_id] = run_status(stack, run_id, secret)
            except SpecopsError:
                continue  # the gateway or its database is still coming back
            body = last[run_id]
            if body is None or body["status"] in TERMINAL:
                pending.pop(run_id)
        time.sleep(POLL_S)
    return last


def account(
    result: Result,
    runs: Sequence[str],
    last: dict[str, dict[str, Any] | None],
    messages: Sequence[StreamMessage],
) -> None:
    """Fill the counts of `result` from the runs' last state and the stream."""
    result.submitted = len(runs)
    ids = Counter(m.msg_id for m in messages if m.msg_id)
    for run_id in runs:
        body = last.get(run_id)
        on_stream = [m.subject for m in messages if m.subject.startswith(f"spec.run.{run_id}.")]
        ends = [s for s in on_stream if s.endswith((".completed", ".failed"))]
        run_ids = {m.msg_id for m in messages if m.subject.startswith(f"spec.run.{run_id}.") and m.msg_id}
        if body is None or f"spec.run.{run_id}.requested" not in on_stream:
            result.lost += 1
            continue
        if len(ends) > 1 or any(ids[i] > 1 for i in run_ids):
            result.duplicated += 1
        if body["status"] == "completed":
            result.completed += 1
        elif body["status"] == "failed":
            result.failed += 1
            error = body.get("error") or {}
            result.failures.append(
                {
                    "run_id": run_id,
                    "error_stage": str(error.get("error_stage")),
                    "message": str(error.get("message")),
                }
            )
        else:
            result.stuck += 1
            result.notes.append(f"run {run_id} still {body['status']}")


# --- faults ----------------------------------------------------------------------------


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Scenario:
    name: str
    inject: Callable[[Stack, list[str], Result], dt.datetime]
    """Applies the fault to a stack whose runs are in flight; returns when the fault was cleared."""


def kill_service(service: str) -> Scenario:
    def inject(stack: Stack, run_ids: list[str], result: Result) -> dt.datetime:
        wait_for_event(stack, run_ids, MID_RUN[service])
        time.sleep(1.0)
        pid = stack.pid(service)
        log(f"kill -9 {service}[0] (pid {pid})")
        kill(pid)
        return utc_now()

    return Scenario(f"kill-{service}", inject)


def kill_nats(stack: Stack, run_ids: list[str], result: Result) -> dt.datetime:
    wait_for_event(stack, run_ids, "bench.requested")
    before = stack.nats_url
    pid = stack.server_pid("nats")
    log(f"kill -9 nats-server (pid {pid})")
    kill(pid)
    cleared = utc_now()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        servers = {s.name: s for s in status(stack.settings).servers}
        if servers["nats"].alive:
            if servers["nats"].url != before:
                result.notes.append(f"nats came back on {servers['nats'].url}, not {before}")
            break
        time.sleep(0.5)
    else:
        result.notes.append("nats-server was not restarted by the watcher in 120 s; ran `specops up`")
        up(stack.settings, None, progress=log)
    return cleared


def postgres_outage(seconds: float) -> Callable[[Stack, list[str], Result], dt.datetime]:
    def inject(stack: Stack, run_ids: list[str], result: Result) -> dt.datetime:
        wait_for_event(stack, run_ids, "bench.requested")
        state = StateDir(stack.settings.state_dir).load()
        record = state.servers["postgres"]
        stop_watcher(stack)
        log(f"stopping postgres for {seconds:g} s")
        postgres_server.stop(record)
        time.sleep(seconds)
        log("starting postgres again (specops up)")
        up(stack.settings, None, progress=log)
        return utc_now()

    return inject


def kill_replicas(stack: Stack, run_ids: list[str], result: Result) -> dt.datetime:
    wait_for_event(stack, run_ids, "bench.requested")
    cleared = utc_now()
    for replica in (0, 1, 0):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                pid = stack.pid(REPLICATED, replica)
                break
            except RuntimeError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"{REPLICATED}[{replica}] was not restarted in 180 s")
        log(f"kill -9 {REPLICATED}[{replica}] (pid {pid})")
        kill(pid)
        cleared = utc_now()
        # The other replica carries the work meanwhile; the next kill waits for this one's restart.
        while stack.pid_or_none(REPLICATED, replica) in (None, pid):
            time.sleep(0.5)
    return cleared


# --- poison ----------------------------------------------------------------------------


def poison(stack: Stack, run_ids: list[str], result: Result) -> dt.datetime:
    wait_for_event(stack, run_ids, "run.queued")
    messages = poison_messages()
    ids = {name: f"chaos-poison-{name}-{uuid.uuid4().hex[:8]}" for name in messages}
    log(f"publishing {len(messages)} poison messages")
    asyncio.run(publish_as_admin(stack, messages, ids))
    cleared = utc_now()
    # Each is parked once by each service that consumes it: wait until every one is.
    parked, letters = wait_parked(stack, ids)
    result.parked = parked
    result.park_errors = {
        name: x.error[:200] for name, msg_id in ids.items() for x in letters if x.msg_id == msg_id
    }
    for name, by_service in parked.items():
        if not by_service:
            result.notes.append(f"poison {name} was never parked")
            result.stuck += 1
        for service, count in by_service.items():
            if count > 1:
                result.notes.append(f"poison {name} parked {count} times by {service}")
                result.duplicated += 1
    return cleared


# --- the suite -------------------------------------------------------------------------


def play(stack: Stack, scenario: Scenario, runs: int, run_timeout_s: float) -> Result:
    result = Result(scenario.name)
    begin = time.monotonic()
    log(f"=== {scenario.name}: {runs} runs")
    secrets = tokens(stack, scenario.name, runs + 1)
    accepted = submit(stack, secrets[:runs])
    in_flight = [run_id for run_id, _ in accepted]
    cleared = scenario.inject(stack, in_flight, result)
    result.max_recovery_s = wait_recovered(stack, in_flight, cleared, run_timeout_s)
    log(f"{scenario.name}: recovered in {result.max_recovery_s} s; one more run")
    accepted += submit(stack, secrets[runs:])
    last = settle(stack, accepted, run_timeout_s)
    messages = asyncio.run(stream_messages(stack))
    account(result, [run_id for run_id, _ in accepted], last, messages)
    result.duration_s = round(time.monotonic() - begin, 1)
    log(f"{scenario.name}: {json.dumps(asdict(result))}")
    return result


def scenarios(postgres_outage_s: float) -> list[Scenario]:
    return [
        # The head-trainer has no part in a run (its kill -9: tests/integration/test_head_trainer_resume.py).
        *(kill_service(service) for service in SERVICES if service in MID_RUN),
        Scenario("kill-nats", kill_nats),
        Scenario("postgres-outage", postgres_outage(postgres_outage_s)),
        Scenario("poison", poison),
        Scenario("kill-replicas", kill_replicas),
    ]


ORDER = [s.name for s in scenarios(0.0)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos.json"))
    parser.add_argument("--runs", type=int, default=3, help="runs in flight per scenario")
    parser.add_argument("--postgres-outage-s", type=float, default=300.0)
    parser.add_argument("--run-timeout-s", type=float, default=900.0)
    parser.add_argument("--only", nargs="*", help="scenario names to play (default: all)")
    args = parser.parse_args()
    # A stopped suite still takes its stack down (the `finally` of `stack`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [s for s in scenarios(args.postgres_outage_s) if not args.only or s.name in args.only]
    results: list[Result] = []
    begin = time.monotonic()
    replicas = dict.fromkeys(SERVICES, 1)
    with stack(replicas, prefix="chaos", keep=os.environ.get("SPECOPS_CHAOS_KEEP") == "1") as running:
        for scenario in chosen:
            if scenario.name == "kill-replicas":
                up(running.settings, replicas | {REPLICATED: 2}, progress=log)
            results.append(play(running, scenario, args.runs, args.run_timeout_s))
            write(args, results, time.monotonic() - begin)
    bad = [r.scenario for r in results if not r.clean]
    log(f"done in {time.monotonic() - begin:.0f} s; " + (f"NOT clean: {bad}" if bad else "all clean"))
    return 1 if bad else 0


def write(args: argparse.Namespace, results: list[Result], elapsed_s: float) -> None:
    """The list of scenario results, each with when and how it was produced."""
    produced = {
        "date": dt.date.today().isoformat(),
        "command": "make chaos",
        "host": f"{platform.machine()}, {os.cpu_count()} cpus, no GPU",
        "runs_in_flight": args.runs,
        "postgres_outage_s": args.postgres_outage_s,
        "suite_elapsed_s": round(elapsed_s, 1),
    }
    rows = [asdict(r) | produced for r in results]
    if args.only and args.out.exists():
        # A rerun of some scenarios replaces their rows and keeps the others'.
        replaced = {row["scenario"] for row in rows}
        rows = [row for row in json.loads(args.out.read_text()) if row["scenario"] not in replaced] + rows
        rows.sort(key=lambda row: ORDER.index(row["scenario"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
