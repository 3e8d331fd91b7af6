"""Nothing stuck: the gateway's reaper fails a stalled run, and `specops dlq redrive` completes a
run whose message was parked by an error fixed since (real NATS and Postgres)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures import bus
from fixtures.gateway import RUNS, running_gateway
from httpx_sse import EventSource
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from specbus import RetryPolicy, SpecBroker
from specbus.dlq import watch_depth
from specbus.publish import MSG_ID, publish_raw
from specops.cli import main
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool

# Two deliveries, then parked: the error below repeats on every one.
PARK_FAST = RetryPolicy(max_deliver=2, backoff_s=(0.1,), ack_wait_s=5.0)


async def test_a_queued_run_no_predictor_takes_is_failed_and_its_stream_ends(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # No predictor runs: nothing would ever move the run on.
    async with running_gateway(db, nats_url, reaper_interval_s=0.2, stage_deadline_queued_s=1.0) as gw:
        created = await gw.create()
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        # The stream ends once the run has failed (ASGITransport returns then).
        stream = await gw.client.get(f"{RUNS}/{run_id}/events", headers=gw.auth())
        run = (await gw.client.get(f"{RUNS}/{run_id}", headers=gw.auth())).json()
        [published] = await bus.events(js, f"spec.run.{run_id}.failed")
        await asyncio.sleep(1.0)  # more sweeps: none fails the run again
        assert await bus.count(js, f"spec.run.{run_id}.failed") == 1

    sse = [m.event for m in EventSource(stream).iter_sse() if m.data]
    assert sse == ["run.queued", "run.failed"]
    assert run["status"] == "failed"
    assert run["error"]["error_stage"] == "prediction"
    assert run["error"]["message"].startswith("no progress in queued for ")
    assert "is a predictor running? see `specops status`" in run["error"]["message"]
    assert published.producer == "gateway" and published.payload.message == run["error"]["message"]


def _cli(*argv: str) -> int:
    return main(list(argv))


def _json_lines(out: str) -> list[dict[str, Any]]:
    """What the command printed as JSON (the services in this process log to stdout too)."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_redrive_completes_a_run_whose_request_was_parked_by_an_error_fixed_since(
    db: str, nats_url: str, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(tmp_path))
    # A fault of the predictor's database that every delivery meets: planning cannot store
    # the ranked candidates until an operator drops the trigger.
    bus.sql(
        db,
        """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'candidates are read-only (maintenance)'; END $$;
           CREATE TRIGGER refuse BEFORE INSERT ON candidates FOR EACH ROW EXECUTE FUNCTION refuse();""",
    )

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, Planner(host=HostInfo(cuda=False)), service=service, retry=PARK_FAST)

    async with running_gateway(db, nats_url) as gw, bus.serving(db, nats_url, "pred", register) as predictor:
        depth = asyncio.get_running_loop().create_task(watch_depth(js, interval_s=0.1))
        # Not measurable on this host: the predictor answers with the predicted best.
        created = await gw.create()
        run_id = created.json()["id"]
        failed = await gw.wait_status(run_id, "failed")
        await _gauge(predictor, 1)

        assert await asyncio.to_thread(_cli, "dlq", "ls", "--service", predictor, "--json") == 0
        [listed] = _json_lines(capsys.readouterr().out)
        seq = listed["seq"]
        assert await asyncio.to_thread(_cli, "dlq", "show", str(seq), "--json") == 0
        [shown] = _json_lines(capsys.readouterr().out)

        bus.sql(db, "DROP TRIGGER refuse ON candidates")
        assert await asyncio.to_thread(_cli, "dlq", "redrive", str(seq)) == 0
        redrove = capsys.readouterr().out
        completed = await gw.wait_status(run_id, "completed")
        await _gauge(predictor, 0)

        assert await asyncio.to_thread(_cli, "dlq", "redrive", str(seq)) == 2
        again = capsys.readouterr().err
        assert await asyncio.to_thread(_cli, "dlq", "redrive", "--all", "--service", predictor) == 0
        everything = capsys.readouterr().out
        assert await asyncio.to_thread(_cli, "dlq", "ls", "--service", predictor, "--json") == 0
        [relisted] = _json_lines(capsys.readouterr().out)
        depth.cancel()

    assert failed["error"]["error_stage"] == "dead_letter"
    assert listed["subject"] == f"spec.run.{run_id}.requested" and listed["redriven_at"] is None
    assert "candidates are read-only (maintenance)" in listed["error"]
    assert shown["body"]["correlation_id"] == run_id
    assert f"redrove {seq} -> spec.run.{run_id}.requested" in redrove
    assert completed["error"] is None and completed["winner"] is not None
    assert "was redriven" in again and "--force" in again
    assert everything.splitlines()[-1] == "nothing to redrive"
    assert relisted["redriven_at"] is not None


async def test_dlq_says_what_a_sequence_is_not(
    nats_url: str, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(tmp_path))
    event = await publish_raw(js, "spec.run.not-a-letter.queued", b"{}", {MSG_ID: uuid.uuid4().hex})
    assert await asyncio.to_thread(_cli, "dlq", "show", str(event.seq)) == 2
    assert (
        f"sequence {event.seq} is not a dead letter but spec.run.not-a-letter.queued"
        in capsys.readouterr().err
    )
    assert await asyncio.to_thread(_cli, "dlq", "redrive", str(event.seq + 1000)) == 2
    assert f"no message at sequence {event.seq + 1000}" in capsys.readouterr().err


async def _gauge(service: str, expected: int) -> None:
    async with asyncio.timeout(30):
        while REGISTRY.get_sample_value("specops_dead_letters", {"service": service}) != expected:
            await asyncio.sleep(0.1)
