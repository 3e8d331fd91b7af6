"""T2 tune sessions through the gateway against a real PostgreSQL and nats-server: the endpoints,
the tune projector, the winner cache, the SDK and `specops tune`.

The tuner is played by the test: it publishes the `tune.*` events the tuner would
(schemas/tune.py), and the gateway's tune projector records them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import nats
import psycopg
import pytest
from fixtures import bus
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

from specbus.envelope import Envelope, new_event
from specbus.subjects import RESULTS_STREAM, STREAM, result_subject
from specops.client import Retry, SpecopsAPIError, SpeculativeClient
from specops.commands import tune as tune_cli
from specops.runtime.rebuild import diff, rebuild
from specops_schemas.api import API_PREFIX, PROBLEM_MEDIA_TYPE, RunCreateRequest
from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Measurement, Prediction
from specops_schemas.catalog import Family, GateMethod
from specops_schemas.events import RunCompleted
from specops_schemas.tune import (
    CurvePoint,
    Dimension,
    TrialResult,
    TuneCompleted,
    TuneFailed,
    TuneImproved,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneTrialCompleted,
)
from specops_services.audit.replay import ReplayStart
from specops_services.gateway.app import create_app

SESSIONS = f"{API_PREFIX}/tune-sessions"
WAIT_S = 15.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --- the T1 run's answer, as the predictor publishes it ---------------------------------------------

NGRAM4 = Candidate(
    candidate_id="ngram-k4", family=Family.NGRAM, k=4, options={"ngram_min": 1, "ngram_max": 4}
)
NGRAM6 = Candidate(
    candidate_id="ngram-k6", family=Family.NGRAM, k=6, options={"ngram_min": 1, "ngram_max": 4}
)
LOOKAHEAD = Candidate(candidate_id="lookahead-k5", family=Family.LOOKAHEAD, k=5)
PREDICTION = Prediction(
    rank=1, score=1.0, acceptance_rate=0.5, mean_acceptance_length=1.9, speedup=1.5, extra_memory_bytes=0
)
GATE = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95)


def measurement(candidate_id: str, speedup: float) -> Measurement:
    return Measurement(
        candidate_id=candidate_id,
        reps=2,
        tokens_per_s=30.0 * speedup,
        tokens_per_s_stdev=0.5,
        speedup=speedup,
        acceptance_rate=0.5,
        mean_acceptance_length=1.9,
        per_position_acceptance=[0.6, 0.5, 0.4, 0.3],
        ttft_s=0.1,
        tpot_s=0.03,
        extra_memory_bytes=0,
    )


T1_WINNER = CandidateResult(
    candidate=NGRAM4, prediction=PREDICTION, measurement=measurement("ngram-k4", 1.4), gate=GATE
)
T1_OTHER = CandidateResult(candidate=LOOKAHEAD, prediction=PREDICTION.model_copy(update={"rank": 2}))
TUNED_WINNER = CandidateResult(
    candidate=NGRAM6, prediction=PREDICTION, measurement=measurement("ngram-k6", 1.6), gate=GATE
)


async def completed_run(gw: Gateway, who: str = "dev", *, measured: bool = True) -> str:
    """A T1 run of `who`'s tenant, completed by the predictor's run.completed."""
    run_id: str = (await gw.create(who)).json()["id"]
    tenant = "globex" if who == "other" else "acme"
    winner = T1_WINNER if measured else T1_WINNER.model_copy(update={"measurement": None, "gate": None})
    answer = RunCompleted(
        run_id=run_id,
        cache_hit=False,
        measured=measured,
        winner=winner,
        candidates=[winner, T1_OTHER],
        pareto_front=["ngram-k4", "lookahead-k5"],
    )
    event = new_event(answer, tenant_id=tenant, correlation_id=run_id, producer="predictor")
    # As the predictor would: after the gateway's own events are on the stream.
    await published(gw.nats_url, f"spec.run.{run_id}.queued")
    await bus.publish_all(gw.nats_url, [event])
    await gw.wait_status(run_id, "completed", who)
    return run_id


# --- what the tuner publishes -------------------------------------------------------------------


def trial(n: int, candidate: Candidate, value: float | None, *, seeded: bool = False) -> TrialResult:
    at = datetime(2026, 11, 25, 12, 0, tzinfo=UTC) + timedelta(minutes=n)
    common: dict[str, Any] = {
        "trial": n,
        "bench_id": f"bench-{n:032x}",
        "candidate": candidate,
        "params": {"family": str(candidate.family), "k": candidate.k},
        "seeded": seeded,
        "started_at": at,
        "finished_at": at + timedelta(seconds=50),
    }
    if value is None:
        return TrialResult(
            **common, state="failed", error_stage="quality_gate", error_message="topk5 agreement 0.80 < 0.95"
        )
    return TrialResult(
        **common,
        state="complete",
        value=value,
        speedup=value,
        speedup_stdev=0.04,
        measurement=measurement(candidate.candidate_id, value),
        gate=GATE,
    )


TRIALS = [trial(0, NGRAM4, 1.4, seeded=True), trial(1, LOOKAHEAD, None), trial(2, NGRAM6, 1.6)]
CURVE = [
    CurvePoint(trial=0, elapsed_s=60.0, value=1.4, best_value=1.4),
    CurvePoint(trial=1, elapsed_s=120.0, value=None, best_value=1.4),
    CurvePoint(trial=2, elapsed_s=180.0, value=1.6, best_value=1.6),
]


def _then(events: list[Envelope[Any]], payload: Any) -> Envelope[Any]:
    return events[-1].follow(payload, producer="tuner")


def tuner_flow(session_id: str, run_id: str, tenant: str = "acme") -> list[Envelope[Any]]:
    """A short session as the tuner publishes it: start, three trials (one failed), narrowing, end."""
    t0 = datetime.now(UTC)
    started = new_event(
        TuneStarted(
            session_id=session_id,
            space=[
                Dimension(name="family", choices=["ngram", "lookahead"]),
                Dimension(name="k", choices=[2, 4, 6]),
                Dimension(name="ngram.ngram_min", choices=[1, 2], family="ngram"),
            ],
            seeded=1,
            budget_s=600.0,
            started_at=t0,
            deadline=t0 + timedelta(seconds=600),
        ),
        tenant_id=tenant,
        correlation_id=session_id,
        producer="tuner",
    )
    events: list[Envelope[Any]] = [started]
    for result, point in zip(TRIALS, CURVE, strict=True):
        events.append(_then(events, TuneTrialCompleted(session_id=session_id, result=result, point=point)))
        if result.value is not None:
            events.append(
                _then(
                    events,
                    TuneImproved(
                        session_id=session_id,
                        best=result,
                        previous_value=None if result.trial == 0 else 1.4,
                    ),
                )
            )
    events.append(
        _then(
            events,
            TuneSpaceNarrowed(
                session_id=session_id,
                importances={"family": 0.7, "k": 0.28, "ngram.ngram_min": 0.02},
                dropped={"ngram.ngram_min": 1},
                after_trials=2,
            ),
        )
    )
    events.append(
        _then(
            events,
            TuneCompleted(
                session_id=session_id,
                run_id=run_id,
                run_request=RunCreateRequest.model_validate(run_body()),
                winner=TUNED_WINNER,
                baseline=None,
                best=TRIALS[2],
                trials=3,
                failed_trials=1,
                curve=CURVE,
                auto_terminated=False,
                reason="max_trials: 3 trials run",
                elapsed_s=185.0,
                downtime_s=0.0,
            ),
        )
    )
    return events


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


async def start(gw: Gateway, run_id: str, who: str = "dev", **fields: Any) -> httpx.Response:
    body = {"run_id": run_id, "budget_minutes": 10, "reps": 2} | fields
    return await gw.client.post(SESSIONS, json=body, headers=gw.auth(who))


async def wait_session(gw: Gateway, session_id: str, until: Any, who: str = "dev") -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        body: dict[str, Any] = (await gw.client.get(f"{SESSIONS}/{session_id}", headers=gw.auth(who))).json()
        if until(body):
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session_id} is {body}")
        await asyncio.sleep(0.05)


async def published(nats_url: str, subject: str, stream: str = STREAM) -> dict[str, Any]:
    """The last event on `subject` of `stream`, once the outbox relay has put it there."""
    nc = await nats.connect(nats_url)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                msg = await nc.jetstream().get_last_msg(stream, subject)
                event: dict[str, Any] = json.loads(msg.data or b"{}")
                return event
            except nats.js.errors.NotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


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
