"""Issue 15's scaling acceptance: live replicas of the services split the work of their
durable consumers, every run completes exactly once, and no two measurements overlap.

`specops up --replicas ...` on a scratch state dir (real NATS, PostgreSQL, the services
as their own processes, the real 135M model) with benches and gates shrunk by settings,
then runs of different tenants submitted at once through the gateway's shared port.
Checked afterwards: one terminal event per run, no duplicate rows or stream messages,
a handled delivery in the log of every replica of every replicated service, and the
device lock's journal (specplatform.hostlock) shows measuring spans that never overlap.

About two minutes on a 2-core host, so it is part of `make test`; `make scale-check`
runs it alone and writes its report (timings, deliveries per replica, the lock's
spans) to bench/results/scale-check.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
import psycopg
import pytest
import torch
from fixtures.runtime import TINY, Runtime, started

from specops.client import SpeculativeClient
from specops.runtime.supervisor import SERVICES, status
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token
from specplatform.hostlock import DeviceLock

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
WORKLOADS = ("chat", "code")
RUN_TIMEOUT_S = 900.0
REPORT_ENV = "SPECOPS_SCALE_REPORT"
# specbus.consumer's line per settled delivery, after `specops serve`'s "service[replica]" prefix.
HANDLED = re.compile(
    r" (?P<service>[a-z-]+)\[(?P<replica>\d+)\] INFO specbus\.consumer: (?P<consumer>\S+): .*: handled in "
)


# Two of every service, the gateway's sharing its port.
# Every service a T1 run goes through, twice; the head-trainer has no part in a run, so its
# one replica would handle nothing here (its own work: tests/integration/test_head_trainer_resume.py).
REPLICAS = {s: 1 if s == "head-trainer" else 2 for s in SERVICES}
RUNS = 6

# uvicorn's access log line of a request.
ACCESS = re.compile(r'"(?:GET|POST) /')


@dataclass
class Report:
    """What `make scale-check` writes to bench/results/scale-check.json."""

    command: str
    runs: int
    replicas: dict[str, int]
    startup_s: float = 0.0
    runs_s: float = 0.0
    handled: dict[str, int] = field(default_factory=dict)  # "service[replica]" -> deliveries handled
    # "gateway[replica]" -> HTTP requests answered; the kernel spreads connections (by a
    # hash of their addresses), so it is reported, not asserted.
    http_requests: dict[str, int] = field(default_factory=dict)
    benches_by_replica: dict[str, int] = field(default_factory=dict)  # "service[replica]" -> benches
    spans: list[dict[str, object]] = field(default_factory=list)  # the cpu lock's journal
    overlapping_spans: int = 0
    lock_wait_s: float = 0.0


@contextmanager
def _started(monkeypatch: pytest.MonkeyPatch, lock_dir: Path) -> Iterator[tuple[Runtime, float]]:
    begin = time.monotonic()
    with started(monkeypatch, REPLICAS, env=TINY | {"SPECOPS_MEASURE_LOCK_DIR": str(lock_dir)}) as runtime:
        yield runtime, time.monotonic() - begin


def _submit(runtime: Runtime, count: int) -> list[str]:
    """`count` runs of `count` tenants (so none is another's winner-cache hit), created at once."""

    async def tokens() -> list[str]:
        return [
            (await issue_token(runtime.database_url, tenant_id=f"scale-{i}", role=Role.DEVELOPER)).secret
            for i in range(count)
        ]

    secrets = asyncio.run(tokens())

    def create(i: int) -> str:
        with SpeculativeClient(runtime.url, secrets[i]) as client:
            run = client.runs.create(
                target=TARGET,
                workload=WORKLOADS[i % len(WORKLOADS)],
                mode="interactive",
                goal={"quality_gate": "topk5"},
            )
            assert run.status == "queued" and run.cache_hit is False
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while (status := client.runs.get(run.id).status) not in ("completed", "failed"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run.id} is {status} after {RUN_TIMEOUT_S:g} s")
                time.sleep(0.5)
            assert status == "completed", f"run {run.id} failed"
            return run.id

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(create, range(count)))


def _assert_once(runtime: Runtime, run_ids: list[str]) -> None:
    """One terminal event per run; no row or event twice, in the tables or on the stream."""
    with psycopg.connect(runtime.database_url, autocommit=True) as conn:

        def per_run(sql: str) -> dict[str, int]:
            rows = conn.execute(sql, (run_ids,)).fetchall()
            return {str(run_id): int(n) for run_id, n in rows}

        terminal = per_run(
            "SELECT run_id, count(*) FROM run_events WHERE run_id = ANY(%s) "
            "AND type IN ('run.completed', 'run.failed') GROUP BY run_id"
        )
        assert terminal == dict.fromkeys(run_ids, 1)
        benches = per_run("SELECT run_id, count(*) FROM benches WHERE run_id = ANY(%s) GROUP BY run_id")
        assert benches == dict.fromkeys(run_ids, 1)
        # One row per (method, rep) and one bench.rep_measured per row; one verdict per
        # measured candidate and one gate.evaluated per verdict.
        reps = per_run("SELECT run_id, count(*) FROM bench_results WHERE run_id = ANY(%s) GROUP BY run_id")
        rep_events = per_run(
            "SELECT run_id, count(*) FROM run_events WHERE run_id = ANY(%s) "
            "AND type = 'bench.rep_measured' GROUP BY run_id"
        )
        assert reps == rep_events and set(reps) == set(run_ids)
        verdicts = per_run("SELECT run_id, count(*) FROM gate_results WHERE run_id = ANY(%s) GROUP BY run_id")
        gate_events = per_run(
            "SELECT run_id, count(*) FROM run_events WHERE run_id = ANY(%s) "
            "AND type = 'gate.evaluated' GROUP BY run_id"
        )
        assert verdicts == gate_events
        twice = conn.execute(
            "SELECT run_id, type, payload->'payload'->>'candidate_id', payload->'payload'->>'rep', count(*) "
            "FROM run_events "
            "WHERE run_id = ANY(%s) GROUP BY 1, 2, 3, 4 "
            "HAVING count(*) > 1 AND type NOT IN ('run.running')",
            (run_ids,),
        ).fetchall()
        assert twice == []
    messages = asyncio.run(_stream_messages(runtime))
    ids = Counter(msg_id for _, msg_id in messages if msg_id)
    assert [i for i, n in ids.items() if n > 1] == [], "a message id is on the stream twice"
    for run_id in run_ids:
        ends = [
            s
            for s, _ in messages
            if s.startswith(f"spec.run.{run_id}.") and s.endswith((".completed", ".failed"))
        ]
        assert ends == [f"spec.run.{run_id}.completed"]


async def _stream_messages(runtime: Runtime) -> list[tuple[str, str]]:
    """(subject, Nats-Msg-Id) of every message on the SPEC stream, in order."""
    nc = await nats.connect(runtime.nats_url, nkeys_seed=runtime.admin_seed)
    try:
        js = nc.jetstream()
        info = await js.stream_info("SPEC")
        sub = await js.subscribe("spec.>", ordered_consumer=True)
        found = []
        for _ in range(info.state.messages):
            msg = await sub.next_msg(timeout=10)
            found.append((msg.subject, (msg.headers or {}).get("Nats-Msg-Id", "")))
        await sub.unsubscribe()
        return found
    finally:
        await nc.close()


def _handled(runtime: Runtime) -> dict[str, int]:
    """Deliveries handled per "service[replica]" of the replicated services."""
    counts = {}
    for service, n in REPLICAS.items():
        for replica in range(n if n > 1 else 0):
            counts[f"{service}[{replica}]"] = len(HANDLED.findall(runtime.log(service, replica)))
    return counts


def _check(runtime: Runtime, lock_dir: Path, report: Report) -> None:
    live = [(p.service, p.replica) for p in status(runtime.settings).processes if p.alive]
    assert sorted(live) == sorted((s, r) for s, n in REPLICAS.items() for r in range(n))
    start = time.monotonic()
    run_ids = _submit(runtime, RUNS)
    report.runs_s = time.monotonic() - start
    _assert_once(runtime, run_ids)

    report.handled = _handled(runtime)
    report.http_requests = {
        f"gateway[{r}]": len(ACCESS.findall(runtime.log("gateway", r))) for r in range(REPLICAS["gateway"])
    }
    idle = [name for name, n in report.handled.items() if n == 0]
    assert idle == [], f"replicas that handled nothing: {idle}"

    spans = DeviceLock(lock_dir, "cpu").spans()
    benches = [s for s in spans if s.purpose.startswith("bench ")]
    report.spans = [asdict(s) for s in spans]
    report.benches_by_replica = dict(Counter(f"{s.service}[{s.replica}]" for s in benches))
    report.lock_wait_s = sum(s.waited_s for s in spans)
    report.overlapping_spans = sum(a.overlaps(b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    assert sorted(s.purpose for s in benches) == sorted(f"bench of run {r}" for r in run_ids)
    assert set(report.benches_by_replica) == {"benchmark-runner[0]", "benchmark-runner[1]"}
    assert report.overlapping_spans == 0
    print(json.dumps({k: v for k, v in asdict(report).items() if k != "spans"}, indent=1))


def test_two_replicas_of_every_service_split_six_runs_and_measure_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    replicas = ",".join(f"{s}={n}" for s, n in REPLICAS.items())
    report = Report(command=f"specops up --replicas {replicas}", runs=RUNS, replicas=REPLICAS)
    with _started(monkeypatch, tmp_path / "locks") as (runtime, startup_s):
        report.startup_s = startup_s
        _check(runtime, tmp_path / "locks", report)
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).write_text(json.dumps(asdict(report), indent=1) + "\n")
