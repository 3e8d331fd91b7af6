"""Issue 3's acceptance test: a T1 run through every service, as `specops up` starts them.

Real embedded NATS and PostgreSQL and the five services as their own processes
(specops.runtime.supervisor.up on a scratch state dir and a free gateway port), driven
through the SDK: the run streams queued -> running -> predicted -> per-rep -> completed,
the identical request is then a winner-cache hit, every event of both runs is in the
audit log, and `specops audit verify` passes. Everything is stopped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import psycopg
import pytest
import torch
from fixtures.runtime import Runtime

from specops.client import RunEvent, SpeculativeClient
from specops_schemas.candidates import BASELINE_ID
from specops_schemas.catalog import Role
from specops_schemas.events import BenchRepMeasured, GateEvaluated, RunCompleted, RunPredicted
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    # On a CUDA host the `cpu` profile is predicted, not measured, so no reps would stream.
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
AUDIT_TIMEOUT_S = 30.0


def _types(events: list[tuple[float, RunEvent]]) -> list[str]:
    return [event.type for _, event in events]


def test_t1_run_through_every_service(runtime: Runtime) -> None:
    token = asyncio.run(issue_token(runtime.database_url, tenant_id="t1-acceptance", role=Role.DEVELOPER))
    with SpeculativeClient(runtime.url, token.secret) as client:
        start = time.monotonic()
        run = client.runs.create(
            target=TARGET, workload="chat", mode="interactive", goal={"quality_gate": "topk5"}
        )
        assert run.status == "queued" and run.cache_hit is False
        events = [(time.monotonic() - start, event) for event in client.runs.stream(run.id)]
        types = _types(events)

        assert types[0] == "run.queued" and types[-1] == "run.completed", types
        assert types.index("run.running") < types.index("run.predicted") < types.index("bench.rep_measured")
        predicted_at = events[types.index("run.predicted")][0]
        predicted = events[types.index("run.predicted")][1].payload
        assert isinstance(predicted, RunPredicted) and predicted.candidates
        reps = [e.payload for _, e in events if isinstance(e.payload, BenchRepMeasured)]
        baseline = [r for r in reps if r.candidate_id == BASELINE_ID]
        measured = [r for r in reps if r.candidate_id != BASELINE_ID]
        assert baseline and measured and all(r.speedup is not None and r.speedup > 0 for r in measured)
        assert len(baseline) == baseline[0].reps, "one baseline measurement per rep"
        gates = [e.payload for _, e in events if isinstance(e.payload, GateEvaluated)]
        assert {g.candidate_id for g in gates} <= {r.candidate_id for r in measured} and gates
        completed = events[-1][1].payload
        assert isinstance(completed, RunCompleted) and completed.cache_hit is False and completed.measured

        final = client.runs.get(run.id)
        assert final.status == "completed" and final.measured is True and final.cache_hit is False
        assert final.winner == completed.winner
        assert any(c.measurement is not None and c.gate is not None for c in final.candidates)
        total_s = events[-1][0]

        hit_start = time.monotonic()
        again = client.runs.create(
            target=TARGET, workload="chat", mode="interactive", goal={"quality_gate": "topk5"}
        )
        hit_s = time.monotonic() - hit_start
        assert again.id != run.id and again.status == "completed" and again.cache_hit is True
        assert hit_s < 1.0
        assert again.winner == final.winner
        assert _types([(0.0, e) for e in client.runs.stream(again.id)]) == ["run.queued", "run.completed"]

    print(
        f"T1: predicted after {predicted_at:.2f} s, completed after {total_s:.1f} s "
        f"({len(reps)} reps); cache hit answered in {hit_s * 1000:.0f} ms"
    )
    _assert_audited(runtime, [run.id, again.id])
    verify = subprocess.run(
        [sys.executable, "-m", "specops.cli", "audit", "verify"],
        env=os.environ | {"SPECOPS_STATE_DIR": str(runtime.settings.state_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith("audit chain intact")


def _assert_audited(runtime: Runtime, run_ids: list[str]) -> None:
    """Every event the runs' streams carried, and each run.requested, is in audit_log."""
    deadline = time.monotonic() + AUDIT_TIMEOUT_S
    with psycopg.connect(runtime.database_url, autocommit=True) as conn:
        streamed = {
            str(row[0])
            for row in conn.execute("SELECT event_id FROM run_events WHERE run_id = ANY(%s)", (run_ids,))
        }
        while True:
            audited = {
                str(row[0])
                for row in conn.execute(
                    "SELECT event_id FROM audit_log "
                    "WHERE convert_from(payload, 'UTF8')::jsonb ->> 'correlation_id' = ANY(%s)",
                    (run_ids,),
                )
            }
            requested = conn.execute(
                "SELECT count(*) FROM audit_log WHERE type = 'run.requested' "
                "AND convert_from(payload, 'UTF8')::jsonb ->> 'correlation_id' = ANY(%s)",
                (run_ids,),
            ).fetchone()
            missing = streamed - audited
            if not missing and requested == (1,):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not in audit_log after {AUDIT_TIMEOUT_S:g} s: {sorted(missing)}")
            time.sleep(0.5)
