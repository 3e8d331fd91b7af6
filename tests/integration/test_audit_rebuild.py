"""Issue 15's "replay for audits": rebuild the state from the SPEC stream, and catch a rewritten log.

The five services run as `specops up` starts them (real embedded NATS and PostgreSQL),
and three runs go through them: one measured here (the `cpu` profile: bench results and
gate verdicts), the identical request again (a winner-cache hit, whose request only its
`run.queued` carries) and one for a GPU this host lacks (predicted, unmeasured). Then
`specops audit replay --rebuild --into` a fresh database and `specops audit diff` find
no difference; a payload rewritten in audit_log with every later hash recomputed and
the head moved passes `specops audit verify`, and `verify --against-stream` names it.
"""

from __future__ import annotations

import asyncio
import time

import nats
import psycopg
import pytest
import torch
from audit_tamper import rewrite_with_recomputed_chain
from fixtures.runtime import Runtime

from specbus.subjects import STREAM
from specops.cli import main as specops
from specops.client import SpeculativeClient
from specops.runtime import postgres_server
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token
from specplatform.db import with_database

pytestmark = [
    pytest.mark.slow,
    # On a CUDA host the `cpu` profile is predicted, not measured: no bench would run.
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

MEASURED = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
PREDICTED = MEASURED | {"gpu": "H100-80GB"}
AUDIT_TIMEOUT_S = 60.0


async def _stream_state(runtime: Runtime) -> tuple[int, int]:
    nc = await nats.connect(runtime.nats_url, nkeys_seed=runtime.admin_seed)
    try:
        js = nc.jetstream()
        state = (await js.stream_info(STREAM)).state
        with pytest.raises(nats.js.errors.APIError):
            await js.purge_stream(STREAM)  # the stream the audit is checked against stays whole
        return state.first_seq, state.last_seq
    finally:
        await nc.close()


def _wait_audited(runtime: Runtime) -> int:
    """Every stream message is in audit_log; the stream's last sequence."""
    deadline = time.monotonic() + AUDIT_TIMEOUT_S
    with psycopg.connect(runtime.database_url, autocommit=True) as conn:
        while True:
            _, last = asyncio.run(_stream_state(runtime))
            recorded = conn.execute("SELECT count(*), max(stream_seq) FROM audit_log").fetchone()
            if recorded == (last, last):
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"audit_log holds {recorded} (rows, last stream_seq), the stream {last}")
            time.sleep(0.5)


def _counts(dsn: str) -> dict[str, int]:
    tables = ("runs", "run_events", "candidates", "bench_results", "gate_results", "winner_cache")
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}  # type: ignore[index]


def test_rebuild_from_the_stream_equals_the_live_tables_and_a_rewritten_log_is_caught(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = asyncio.run(issue_token(runtime.database_url, tenant_id="audit-rebuild", role=Role.DEVELOPER))
    started = time.monotonic()
    with SpeculativeClient(runtime.url, token.secret) as client:
        ask = {"workload": "chat", "mode": "interactive", "goal": {"quality_gate": "topk5"}}
        measured = client.runs.create(target=MEASURED, **ask)
        assert [e.type for e in client.runs.stream(measured.id)][-1] == "run.completed"
        hit = client.runs.create(target=MEASURED, **ask)
        assert hit.status == "completed" and hit.cache_hit is True
        predicted = client.runs.create(target=PREDICTED, **ask)
        assert [e.type for e in client.runs.stream(predicted.id)][-1] == "run.completed"
        assert client.runs.get(predicted.id).measured is False
    runs_s = time.monotonic() - started
    last_seq = _wait_audited(runtime)

    monkeypatch.setenv("DATABASE_URL", runtime.database_url)
    monkeypatch.setenv("NATS_URL", runtime.nats_url)
    monkeypatch.setenv("NATS_NKEY_SEED_FILE", runtime.admin_seed)
    admin = with_database(runtime.database_url, "postgres")
    postgres_server.create_database(admin, "rebuilt")
    rebuilt = with_database(runtime.database_url, "rebuilt")

    started = time.monotonic()
    assert specops(["audit", "replay", "--rebuild", "--into", rebuilt]) == 0
    rebuild_s = time.monotonic() - started
    out = capsys.readouterr().out
    assert f"rebuilt from {last_seq} messages" in out and "not written" not in out, out

    live = _counts(runtime.database_url)
    assert live["runs"] == 3 and live["winner_cache"] == 2 and live["bench_results"] and live["gate_results"]
    assert _counts(rebuilt) == live
    assert specops(["audit", "diff", "--into", rebuilt]) == 0
    assert capsys.readouterr().out.strip() == "no differences"

    # A database that already holds state is not a rebuild target.
    assert specops(["audit", "replay", "--rebuild", "--into", rebuilt]) == 2
    assert "must be a fresh database" in capsys.readouterr().err

    # The live tables changed behind the stream's back: the diff names the row and column.
    with psycopg.connect(runtime.database_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET cache_hit = NOT cache_hit WHERE id = %s", (predicted.id,))
    assert specops(["audit", "diff", "--into", rebuilt]) == 1
    assert capsys.readouterr().out.strip() == f"runs {predicted.id}: cache_hit: live True != rebuilt False"

    with psycopg.connect(runtime.database_url, autocommit=True) as conn:
        seq, stream_seq, payload = conn.execute(
            "SELECT seq, stream_seq, payload FROM audit_log WHERE type = 'run.completed' ORDER BY seq LIMIT 1"
        ).fetchone()  # type: ignore[misc]
    rewrite_with_recomputed_chain(
        runtime.database_url, seq, bytes(payload).replace(b'"cache_hit":false', b'"cache_hit":true')
    )

    assert specops(["audit", "verify"]) == 0  # documented: the chain alone is self-consistent again
    assert capsys.readouterr().out.startswith("audit chain intact")
    assert specops(["audit", "verify", "--against-stream"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        f"audit log differs from the stream at seq {seq}: stream_seq {stream_seq}: "
        "payload differs from the stream's message"
    )
    print(f"3 runs in {runs_s:.0f} s; rebuild of {last_seq} stream messages in {rebuild_s:.2f} s")
