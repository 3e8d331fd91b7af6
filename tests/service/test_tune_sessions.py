"""T2 tune sessions through the gateway against a real PostgreSQL and nats-server: the endpoints,
the tune projector, the winner cache, the SDK and `specops tune`.

The tuner is played by the test: it publishes the `tune.*` events the tuner would
(schemas/tune.py), and the gateway's tune projector records them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import nats
import psycopg
import pytest
from fixtures import bus
from fixtures.flows import (
    SESSIONS,
    T1_OTHER,
    T1_WINNER,
    WAIT_S,
    completed_run,
    published,
    start,
    tuner_flow,
    wait_session,
)
from fixtures.gateway import (
    RUNS,
    Gateway,
    ServerThread,
    gateway_settings,
    issue_tokens,
    run_body,
    running_gateway,
)
from fixtures.postgres import PostgresCluster

from specbus.envelope import new_event
from specbus.subjects import RESULTS_STREAM, result_subject
from specops.client import Retry, SpecopsAPIError, SpeculativeClient
from specops.commands import tune as tune_cli
from specops.runtime.rebuild import diff, rebuild
from specops_schemas.api import PROBLEM_MEDIA_TYPE
from specops_schemas.catalog import Family
from specops_schemas.events import RunCompleted
from specops_schemas.tune import (
    TuneFailed,
)
from specops_services.audit.replay import ReplayStart
from specops_services.gateway.app import create_app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture
async def gw(db: str, nats_url: str) -> AsyncIterator[Gateway]:
    async with running_gateway(db, nats_url) as gateway:
        yield gateway


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"]
    return body


def sse_events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


# --- bad requests -----------------------------------------------------------------------------------


async def test_bad_requests_are_problems(gw: Gateway) -> None:
    unknown = "3f0e2a8c-0000-4000-8000-000000000000"
    assert unknown in assert_problem(await start(gw, unknown), 404)["detail"]
    theirs = await completed_run(gw, "other")
    assert theirs in assert_problem(await start(gw, theirs), 404)["detail"]

    queued = (await gw.create()).json()["id"]
    conflict = assert_problem(await start(gw, queued), 409)
    assert conflict["detail"] == f"run {queued} is queued; a tune session needs a completed run"

    predicted = await completed_run(gw, measured=False)
    assert "cannot be measured on this host" in assert_problem(await start(gw, predicted), 409)["detail"]

    ours = await completed_run(gw)
    for budget in (0, 10_000):
        invalid = assert_problem(await start(gw, ours, budget_minutes=budget), 422)
        assert invalid["errors"][0]["pointer"] == "#/budget_minutes"
    assert_problem(await start(gw, ours, "viewer"), 403)
    assert_problem(await gw.client.get(f"{SESSIONS}/{unknown}", headers=gw.auth()), 404)


# --- POST -> tune.requested -------------------------------------------------------------------------


async def test_post_queues_tune_requested_with_the_runs_answer(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    key = {"Idempotency-Key": '"tune-1"'}
    body = {"run_id": run_id, "budget_minutes": 10, "reps": 2}
    created = await gw.client.post(SESSIONS, json=body, headers=gw.auth(**key))
    assert created.status_code == 202, created.text
    session = created.json()
    assert session["status"] == "queued" and session["budget_s"] == 600.0
    assert created.headers["location"] == f"{SESSIONS}/{session['id']}"
    again = await gw.client.post(SESSIONS, json=body, headers=gw.auth(**key))
    assert again.json()["id"] == session["id"] and again.headers["idempotent-replayed"] == "true"

    event = await published(gw.nats_url, f"spec.tune.{session['id']}.requested")
    assert event["correlation_id"] == session["id"] and event["tenant_id"] == "acme"
    payload = event["payload"]
    assert payload["run_pareto_front"] == ["ngram-k4", "lookahead-k5"]
    assert [c["candidate"]["candidate_id"] for c in payload["run_candidates"]] == ["ngram-k4", "lookahead-k5"]
    assert payload["run_winner"]["candidate"]["candidate_id"] == "ngram-k4"
    assert (
        payload["run_request"]
        == (await gw.client.get(f"{RUNS}/{run_id}", headers=gw.auth())).json()["request"]
    )


# --- the tuner's events -> GET, SSE, curve, cache, apply ----------------------------------------------


async def test_a_scripted_session_moves_get_sse_curve_cache_and_apply(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    session_id = (await start(gw, run_id)).json()["id"]
    path = f"{SESSIONS}/{session_id}"
    assert_problem(await gw.client.get(f"{path}/curve.png", headers=gw.auth("viewer")), 404)
    assert_problem(await gw.client.post(f"{path}/apply", headers=gw.auth()), 409)

    events = tuner_flow(session_id, run_id)
    # Until the second trial: started, trial 0, improved, trial 1.
    await bus.publish_all(gw.nats_url, events[:4])
    running = await wait_session(gw, session_id, lambda s: len(s["trials"]) == 2)
    assert running["status"] == "running" and running["best"]["trial"] == 0
    assert running["trials"][1]["state"] == "failed" and running["curve_png"] == f"{path}/curve.png"
    png = await gw.client.get(f"{path}/curve.png", headers=gw.auth("viewer"))
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(PNG_MAGIC)

    # A stream opened now, resuming after the first trial, ends on tune.completed.
    stream = asyncio.create_task(
        gw.client.get(f"{path}/events", headers=gw.auth("viewer", **{"Last-Event-ID": "3"}))
    )
    await asyncio.sleep(0.3)
    await bus.publish_all(gw.nats_url, events[4:])
    resumed = sse_events((await asyncio.wait_for(stream, WAIT_S)).text)
    assert [e["id"] for e in resumed] == [str(n) for n in range(4, 10)]
    assert [e["event"] for e in resumed] == [
        "tune.improved",
        "tune.trial_completed",
        "tune.trial_completed",
        "tune.improved",
        "tune.space_narrowed",
        "tune.completed",
    ]

    done = await wait_session(gw, session_id, lambda s: s["status"] == "completed")
    assert done["winner"]["candidate"]["candidate_id"] == "ngram-k6" and done["best"]["trial"] == 2
    assert done["dropped"] == {"ngram.ngram_min": 1} and done["importances"]["family"] == 0.7
    assert [t["speedup_stdev"] for t in done["trials"]] == [0.04, None, 0.04]
    assert done["termination_reason"] == "max_trials: 3 trials run" and done["auto_terminated"] is False
    whole = sse_events((await gw.client.get(f"{path}/events", headers=gw.auth("viewer"))).text)
    assert whole[0]["event"] == "tune.requested" and whole[-1]["event"] == "tune.completed"
    assert [e["id"] for e in whole] == [str(n) for n in range(1, 10)]

    # The tenant hears the session's events on its results subjects, as it hears its runs'.
    heard = await published(gw.nats_url, result_subject("acme", session_id, "tune.completed"), RESULTS_STREAM)
    assert heard["payload"]["winner"]["candidate"]["candidate_id"] == "ngram-k6"

    # The tuned winner is the cached answer of the T1 request, and apply gives its flags.
    hit = await gw.create()
    assert hit.status_code == 200, hit.text
    answer = hit.json()
    assert answer["cache_hit"] is True and answer["winner"]["candidate"]["candidate_id"] == "ngram-k6"
    assert answer["pareto_front"][0] == "ngram-k6"
    applied = await gw.client.post(f"{path}/apply", json={"engine": "vllm"}, headers=gw.auth())
    assert applied.status_code == 200, applied.text
    flags = applied.json()
    assert flags["candidate_id"] == "ngram-k6" and flags["cli_args"][0] == "--speculative-config"
    assert json.loads(flags["cli_args"][1])["num_speculative_tokens"] == 6

    for response in (
        await gw.client.get(path, headers=gw.auth("other")),
        await gw.client.get(f"{path}/events", headers=gw.auth("other")),
        await gw.client.get(f"{path}/curve.png", headers=gw.auth("other")),
        await gw.client.post(f"{path}/apply", headers=gw.auth("other")),
    ):
        assert_problem(response, 404)


async def test_a_failed_session_reports_its_error_and_foreign_events_are_skipped(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    session_id = (await start(gw, run_id)).json()["id"]
    foreign = tuner_flow(session_id, run_id, tenant="globex")
    failed = new_event(
        TuneFailed(session_id=session_id, error_stage="benchmark", message="no benchmark-runner answered"),
        tenant_id="acme",
        correlation_id=session_id,
        producer="tuner",
    )
    await bus.publish_all(gw.nats_url, [*foreign, failed])
    body = await wait_session(gw, session_id, lambda s: s["status"] == "failed")
    assert body["error"] == {"error_stage": "benchmark", "message": "no benchmark-runner answered"}
    assert body["trials"] == [] and body["winner"] is None
    assert_problem(await gw.client.post(f"{SESSIONS}/{session_id}/apply", headers=gw.auth()), 409)


async def test_a_rebuild_from_the_stream_equals_the_live_session(
    gw: Gateway, embedded_postgres: PostgresCluster
) -> None:
    since = datetime.now(UTC)
    run_id = await completed_run(gw)
    session_id = (await start(gw, run_id)).json()["id"]
    # As the tuner would: once tune.requested is on the stream.
    await published(gw.nats_url, f"spec.tune.{session_id}.requested")
    await bus.publish_all(gw.nats_url, tuner_flow(session_id, run_id))
    await wait_session(gw, session_id, lambda s: s["status"] == "completed")
    name = f"rebuilt_{uuid.uuid4().hex[:12]}"
    into = embedded_postgres.create(name)
    try:
        nc = await nats.connect(gw.nats_url)
        try:
            report = await rebuild(nc, into, ReplayStart(since=since))
        finally:
            await nc.close()
        assert not report.unwritten
        assert await diff(gw.dsn, into) == []
        async with await psycopg.AsyncConnection.connect(into) as conn:
            cur = await conn.execute("SELECT status FROM tune_sessions WHERE id = %s", (session_id,))
            assert await cur.fetchone() == ("completed",)
    finally:
        embedded_postgres.drop(name)


# --- the SDK and `specops tune` on uvicorn ----------------------------------------------------------


@pytest.fixture
def served(db: str, nats_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    tokens = asyncio.run(issue_tokens(db))
    with ServerThread(create_app(gateway_settings(db, nats_url))) as server:
        yield server.url, tokens


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    tune_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *argv])
    code: int = args.handler(args)
    return code


def test_sdk_and_cli(
    served: tuple[str, dict[str, str]], nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, tokens = served
    fast = Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.05)
    with SpeculativeClient(url, tokens["dev"], retry=fast) as client:
        run = client.runs.create(**run_body())
        answer = RunCompleted(
            run_id=run.id,
            cache_hit=False,
            measured=True,
            winner=T1_WINNER,
            candidates=[T1_WINNER, T1_OTHER],
            pareto_front=["ngram-k4"],
        )
        completed = new_event(answer, tenant_id="acme", correlation_id=run.id, producer="predictor")
        asyncio.run(bus.publish_all(nats_url, [completed]))
        client.runs.wait(run.id, timeout=WAIT_S)

        session = client.tune_sessions.create(run_id=run.id, budget_minutes=10, reps=2, families=["ngram"])
        assert session.status == "queued" and session.request.families == [Family.NGRAM]
        asyncio.run(bus.publish_all(nats_url, tuner_flow(session.id, run.id)))
        streamed = list(client.tune_sessions.stream(session.id))
        assert streamed[0].type == "tune.requested" and streamed[-1].type == "tune.completed"
        assert [e.id for e in client.tune_sessions.stream(session.id, last_event_id=7)] == ["8", "9"]
        tuned = client.tune_sessions.get(session.id)
        assert tuned.status == "completed" and tuned.winner is not None
        assert client.tune_sessions.curve_png(session.id).startswith(PNG_MAGIC)
        assert client.tune_sessions.apply(session.id, engine="vllm").candidate_id == "ngram-k6"
        with pytest.raises(SpecopsAPIError) as refused:
            client.tune_sessions.create(run_id=client.runs.create(**run_body(engine="sglang")).id)
        assert refused.value.status == 409

        failing = client.tune_sessions.create(run_id=run.id, budget_minutes=5)
        failed = new_event(
            TuneFailed(session_id=failing.id, error_stage="benchmark", message="no runner"),
            tenant_id="acme",
            correlation_id=failing.id,
            producer="tuner",
        )
        asyncio.run(bus.publish_all(nats_url, [failed]))

    auth = ("--url", url, "--token", tokens["dev"])
    capsys.readouterr()
    assert _cli("--session", session.id, *auth) == 0
    out, err = capsys.readouterr()
    assert "trial 2  ngram k=6 ngram 1-4  1.60x ± 0.04  best 1.60x (trial 2)  [3:00 of 10:00]" in err
    assert "trial 1  lookahead k=5  FAILED (quality_gate: topk5 agreement 0.80 < 0.95)" in err
    assert "space narrowed after 2 trials: fixed ngram.ngram_min=1" in err
    assert "winner: ngram k=6 ngram 1-4  1.60x ± 0.04" in out and "--speculative-config" in out
    assert _cli("--session", failing.id, *auth) == 1
    assert "failed at benchmark: no runner" in capsys.readouterr().out
    assert _cli("--run", run.id, "--budget-minutes", "0", *auth) == 2
    assert "budget_minutes" in capsys.readouterr().err
