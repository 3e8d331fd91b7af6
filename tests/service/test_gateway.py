"""The HTTP gateway against a real PostgreSQL and nats-server: runs, auth, idempotency, SSE, apply, fuzz."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import nats
import psycopg
import pytest
import schemathesis
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
from psycopg.types.json import Jsonb
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from specbus.envelope import Envelope, new_event
from specbus.subjects import STREAM
from specops.commands import tokens as tokens_cli
from specops_schemas.api import API_PREFIX, PROBLEM_MEDIA_TYPE
from specops_schemas.candidates import (
    Candidate,
    CandidateResult,
    GateOutcome,
    Measurement,
    Prediction,
    RankedCandidate,
)
from specops_schemas.catalog import Family, GateMethod, Role, RunStatus
from specops_schemas.events import (
    BenchRepMeasured,
    RepMetrics,
    RunCompleted,
    RunFailed,
    RunPredicted,
    RunRunning,
)
from specops_services.gateway import idempotency
from specops_services.gateway.app import create_app
from specops_services.gateway.http import credentials
from specops_services.gateway.http.tokens import issue_token
from specops_services.gateway.runs import logic as run_logic

WAIT_S = 10.0


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


# --- events the rest of the pipeline publishes ----------------------------------------------------

NGRAM = Candidate(candidate_id="ngram-k4", family=Family.NGRAM, k=4, options={"ngram_min": 1, "ngram_max": 4})
EAGLE_TREE = Candidate(
    candidate_id="eagle3-tree",
    family=Family.EAGLE,
    draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    k=3,
    tree=[4, 2, 1],
)
PREDICTION = Prediction(
    rank=1, score=1.0, acceptance_rate=0.5, mean_acceptance_length=1.9, speedup=1.5, extra_memory_bytes=0
)
MEASURED = Measurement(
    candidate_id="ngram-k4",
    reps=1,
    tokens_per_s=30.0,
    tokens_per_s_stdev=0.0,
    speedup=1.4,
    acceptance_rate=0.5,
    mean_acceptance_length=1.9,
    per_position_acceptance=[0.6, 0.5, 0.4, 0.3],
    ttft_s=0.1,
    tpot_s=0.03,
    extra_memory_bytes=0,
)
WINNER = CandidateResult(
    candidate=NGRAM,
    prediction=PREDICTION,
    measurement=MEASURED,
    gate=GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95),
)
OTHER = CandidateResult(candidate=EAGLE_TREE, prediction=PREDICTION.model_copy(update={"rank": 2}))


def metrics() -> RepMetrics:
    return RepMetrics(
        prompt_tokens=10,
        new_tokens=20,
        verify_steps=10,
        drafted_tokens=40,
        accepted_tokens=20,
        rollbacks=5,
        draft_time_s=0.01,
        verify_time_s=0.5,
        ttft_s=0.1,
        total_time_s=0.66,
        extra_memory_bytes=0,
        drafted_per_position=[10, 10, 10, 10],
        accepted_per_position=[6, 5, 5, 4],
        acceptance_rate=0.5,
        mean_acceptance_length=3.0,
        per_position_acceptance=[0.6, 0.5, 0.5, 0.4],
        tpot_s=0.03,
        tokens_per_s=30.0,
    )


def flow(run_id: str, tenant: str = "acme", *, fail: bool = False) -> list[Envelope[Any]]:
    """What predictor, benchmark-runner and quality gate publish for one run (correlation_id = run id)."""
    running = new_event(
        RunRunning(run_id=run_id, stage="predicting"),
        tenant_id=tenant,
        correlation_id=run_id,
        producer="predictor",
    )
    if fail:
        return [
            running,
            running.follow(
                RunFailed(run_id=run_id, error_stage="prediction", message="no luck"), producer="predictor"
            ),
        ]
    predicted = running.follow(
        RunPredicted(
            run_id=run_id,
            candidates=[
                RankedCandidate(candidate=NGRAM, prediction=PREDICTION),
                RankedCandidate(candidate=EAGLE_TREE, prediction=OTHER.prediction),
            ],
            pareto_front=["ngram-k4"],
        ),
        producer="predictor",
    )
    rep = predicted.follow(
        BenchRepMeasured(
            bench_id=f"b-{run_id[:8]}", candidate_id="ngram-k4", rep=0, reps=1, metrics=metrics(), speedup=1.4
        ),
        producer="benchmark-runner",
    )
    completed = rep.follow(
        RunCompleted(
            run_id=run_id,
            cache_hit=False,
            measured=True,
            winner=WINNER,
            candidates=[WINNER, OTHER],
            pareto_front=["ngram-k4"],
        ),
        producer="predictor",
    )
    return [running, predicted, rep, completed]


def parse_sse(text: str) -> tuple[list[dict[str, str]], list[str]]:
    """(events as {id, event, data}, comment lines) of a text/event-stream body."""
    events, comments = [], []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
            elif line:
                name, _, value = line.partition(":")
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events, comments


def test_status_only_moves_forward() -> None:
    running, predicted, rep, completed = flow("r-1")
    queued = run_logic.RunState(RunStatus.QUEUED)
    at_predicted = run_logic.fold(run_logic.fold(queued, running), predicted)
    assert at_predicted.status == RunStatus.PREDICTED and len(at_predicted.candidates) == 2
    assert run_logic.fold(at_predicted, running) is at_predicted  # e.g. running(stage=measuring)
    assert run_logic.fold(at_predicted, rep) is at_predicted
    done = run_logic.fold(queued, completed)  # events may overtake each other
    assert done.status == RunStatus.COMPLETED and done.winner == WINNER.model_dump(mode="json")
    for late in (running, predicted, *flow("r-1", fail=True)):
        assert run_logic.fold(done, late) is done


# --- POST -> GET, tenant scoping, auth ------------------------------------------------------------


async def test_post_queues_the_run_and_publishes_run_requested(gw: Gateway) -> None:
    created = await gw.create()
    assert created.status_code == 202, created.text
    run = created.json()
    assert run["status"] == "queued" and run["cache_hit"] is False
    assert created.headers["location"] == f"{RUNS}/{run['id']}"
    assert run["request"]["target"]["model_ref"] == "meta-llama/Llama-3.1-70B-Instruct"

    got = await gw.client.get(created.headers["location"], headers=gw.auth("viewer"))
    assert got.status_code == 200
    assert got.json() == run

    # The outbox relay put run.requested on the bus for the predictor, correlated by run id.
    nc = await nats.connect(gw.nats_url)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                msg = await nc.jetstream().get_last_msg(STREAM, f"spec.run.{run['id']}.requested")
                break
            except nats.js.errors.NotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await nc.close()
    assert msg.data is not None
    event = json.loads(msg.data)
    assert event["type"] == "run.requested" and event["correlation_id"] == run["id"]
    assert event["tenant_id"] == "acme" and event["payload"]["request"] == run["request"]


async def test_projector_moves_the_run_to_completed(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    events = flow(run_id)
    await bus.publish_all(gw.nats_url, events[:2])
    predicted = await gw.wait_status(run_id, "predicted")
    assert [c["candidate"]["candidate_id"] for c in predicted["candidates"]] == ["ngram-k4", "eagle3-tree"]
    assert predicted["winner"] is None

    # A redelivered event changes nothing; a late `running` does not move the status back.
    await bus.publish_all(gw.nats_url, [*events[2:], events[0]])
    done = await gw.wait_status(run_id, "completed")
    assert done["winner"] == WINNER.model_dump(mode="json")
    assert done["measured"] is True and done["cache_hit"] is False and done["pareto_front"] == ["ngram-k4"]

    stream = await gw.client.get(f"{RUNS}/{run_id}/events", headers=gw.auth("viewer"))
    sse, _ = parse_sse(stream.text)
    assert [e["event"] for e in sse] == [
        "run.queued",
        "run.running",
        "run.predicted",
        "bench.rep_measured",
        "run.completed",
    ]
    assert [e["id"] for e in sse] == ["1", "2", "3", "4", "5"]


async def test_failed_run_reports_its_error(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    await bus.publish_all(gw.nats_url, flow(run_id, fail=True))
    failed = await gw.wait_status(run_id, "failed")
    assert failed["error"] == {"error_stage": "prediction", "message": "no luck"}


async def test_events_of_another_tenant_do_not_touch_the_run(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    await bus.publish_all(gw.nats_url, flow(run_id, tenant="globex"))
    # The same run's own events, published after, are projected: the foreign ones were skipped.
    await bus.publish_all(gw.nats_url, flow(run_id, fail=True))
    failed = await gw.wait_status(run_id, "failed")
    assert failed["winner"] is None


async def test_another_tenant_sees_nothing(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    for response in (
        await gw.client.get(f"{RUNS}/{run_id}", headers=gw.auth("other")),
        await gw.client.get(f"{RUNS}/{run_id}/events", headers=gw.auth("other")),
        await gw.client.post(f"{RUNS}/{run_id}/apply", headers=gw.auth("other")),
    ):
        assert_problem(response, 404)


async def test_a_tenant_at_its_active_run_limit_gets_429_and_others_do_not(gw: Gateway) -> None:
    gw.app.state.settings = gw.app.state.settings.model_copy(update={"gateway_max_active_runs": 2})
    busy = await issue_token(gw.dsn, tenant_id=f"quota-{time.monotonic_ns()}", role=Role.DEVELOPER)
    headers = {"Authorization": f"Bearer {busy.secret}"}
    for _ in range(2):
        assert (await gw.client.post(RUNS, json=run_body(), headers=headers)).status_code == 202
    over = await gw.client.post(RUNS, json=run_body(), headers=headers)
    assert over.status_code == 429 and over.headers["content-type"] == PROBLEM_MEDIA_TYPE
    problem = over.json()
    assert problem["type"] == "urn:specops:problem:quota-exceeded"
    assert problem["detail"].startswith("the tenant has 2 runs queued or running")
    assert (await gw.create()).status_code == 202  # another tenant's runs do not count


async def test_a_body_over_the_limit_is_413_declared_or_streamed(gw: Gateway) -> None:
    limit = gw.app.state.settings.gateway_max_body_bytes
    huge = json.dumps(run_body() | {"padding": "x" * (2 * limit)}).encode()
    declared = await gw.client.post(
        RUNS, content=huge, headers=gw.auth(**{"content-type": "application/json"})
    )

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(huge), 65536):
            yield huge[start : start + 65536]

    streamed = await gw.client.post(
        RUNS, content=chunks(), headers=gw.auth(**{"content-type": "application/json"})
    )
    for response in (declared, streamed):
        assert response.status_code == 413 and response.headers["content-type"] == PROBLEM_MEDIA_TYPE
        body = response.json()
        assert body["type"] == "urn:specops:problem:body-too-large" and str(limit) in body["detail"]
    assert (await gw.create()).status_code == 202  # a body under the limit is served as before


async def test_missing_or_wrong_token_is_401_with_a_bearer_challenge(gw: Gateway) -> None:
    for headers in ({}, {"Authorization": "Bearer spk_not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}):
        for response in (
            await gw.client.post(RUNS, json=run_body(), headers=headers),
            await gw.client.get(f"{RUNS}/any", headers=headers),
        ):
            assert_problem(response, 401)
            assert response.headers["www-authenticate"].startswith("Bearer")


async def test_roles(gw: Gateway) -> None:
    assert_problem(await gw.create("viewer"), 403)
    created = await gw.create("admin")
    assert created.status_code == 202
    run_id = created.json()["id"]
    assert (await gw.client.get(f"{RUNS}/{run_id}", headers=gw.auth("viewer"))).status_code == 200
    assert_problem(await gw.client.post(f"{RUNS}/{run_id}/apply", headers=gw.auth("viewer")), 403)


async def test_revoked_token_is_refused(gw: Gateway) -> None:
    async with await psycopg.AsyncConnection.connect(gw.dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE api_tokens SET revoked_at = now() WHERE secret_sha256 = %s",
            (credentials.hash_token(gw.tokens["admin"]),),
        )
    assert_problem(await gw.create("admin"), 401)


def test_tokens_cli_prints_a_token_once_and_stores_its_hash(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    tokens_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["tokens", "create", "--tenant", "initech", "--role", "viewer", "--database-url", db]
    )
    assert args.handler(args) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith(credentials.TOKEN_PREFIX)
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT tenant_id, role FROM api_tokens WHERE secret_sha256 = %s",
            (credentials.hash_token(secret),),
        ).fetchone()
        stored = conn.execute(
            "SELECT count(*) FROM api_tokens WHERE secret_sha256 = %s", (secret,)
        ).fetchone()
    assert row == ("initech", "viewer") and stored == (0,)
    bad = parser.parse_args(
        ["tokens", "create", "--tenant", "no spaces", "--role", "admin", "--database-url", db]
    )
    assert bad.handler(bad) == 2


# --- idempotency ----------------------------------------------------------------------------------


async def count_runs(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute("SELECT count(*) FROM runs")).fetchone()
    assert row is not None
    return int(row[0])


async def test_replay_returns_the_stored_response(gw: Gateway) -> None:
    first = await gw.create(**{"Idempotency-Key": '"k-1"'})
    # Same key, same body re-serialised differently: the same answer, no second run.
    again = await gw.client.post(
        RUNS,
        content=json.dumps(run_body(), indent=2).encode(),
        headers=gw.auth(**{"Idempotency-Key": '"k-1"', "Content-Type": "application/json"}),
    )
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert await count_runs(gw.dsn) == 1
    # Keys are per tenant: globex's k-1 is a different request.
    assert (await gw.create("other", **{"Idempotency-Key": '"k-1"'})).json()["id"] != first.json()["id"]


async def test_same_key_with_another_body_is_422(gw: Gateway) -> None:
    assert (await gw.create(**{"Idempotency-Key": "k-2"})).status_code == 202
    reused = await gw.create(body=run_body(engine="sglang"), **{"Idempotency-Key": "k-2"})
    assert "different request" in assert_problem(reused, 422)["detail"]


async def test_same_key_in_flight_is_409(gw: Gateway) -> None:
    # Another gateway replica holding the key = a request still in progress.
    async with await psycopg.AsyncConnection.connect(gw.dsn) as conn, conn.transaction():
        cur = await conn.execute("SELECT pg_advisory_xact_lock(%s)", (idempotency._lock_id("acme", "k-3"),))
        await cur.fetchone()
        assert_problem(await gw.create(**{"Idempotency-Key": "k-3"}), 409)
    assert (await gw.create(**{"Idempotency-Key": "k-3"})).status_code == 202


async def test_failed_request_leaves_the_key_free(gw: Gateway) -> None:
    bad = await gw.create(body=run_body(model_ref="no/such-model"), **{"Idempotency-Key": "k-4"})
    assert_problem(bad, 422)
    assert (await gw.create(**{"Idempotency-Key": "k-4"})).status_code == 202


async def test_malformed_idempotency_key_is_400(gw: Gateway) -> None:
    for key in ('"unterminated', '"a" "b"', '""'):
        assert_problem(await gw.create(**{"Idempotency-Key": key}), 400)


# --- winner cache ---------------------------------------------------------------------------------


async def test_cache_hit_completes_at_once_and_is_recorded(gw: Gateway) -> None:
    async with await psycopg.AsyncConnection.connect(gw.dsn, autocommit=True) as conn:
        await conn.execute(
            """INSERT INTO winner_cache (cache_scope, model_ref, gpu, engine, engine_version, fingerprint,
                   mode, quality_gate, winner, candidates, pareto_front, measured)
               VALUES ('acme', 'meta-llama/Llama-3.1-70B-Instruct', 'H100-80GB', 'vllm', '', 'chat',
                   'interactive', 'topk5', %s, %s, %s, true)""",
            (
                Jsonb(WINNER.model_dump(mode="json")),
                Jsonb([WINNER.model_dump(mode="json")]),
                Jsonb(["ngram-k4"]),
            ),
        )
    # `h100` is the same profile as `H100-80GB`, so it shares the cached winner: the POST itself
    # answers 200 with the run completed (no bus round trip; its latency is bench/t1_latency.py's).
    hit = await gw.create(body=run_body(gpu="h100"))
    assert hit.status_code == 200, hit.text
    run = hit.json()
    assert run["status"] == "completed" and run["cache_hit"] is True
    assert run["winner"] == WINNER.model_dump(mode="json")
    assert (await gw.client.get(f"{RUNS}/{run['id']}", headers=gw.auth())).json() == run
    sse, _ = parse_sse((await gw.client.get(f"{RUNS}/{run['id']}/events", headers=gw.auth())).text)
    assert [e["event"] for e in sse] == ["run.queued", "run.completed"]
    assert json.loads(sse[1]["data"])["payload"]["cache_hit"] is True
    # Another tenant's identical request does not see acme's winner (F-S1).
    assert (await gw.create("other", body=run_body(gpu="h100"))).status_code == 202


async def test_a_completed_run_answers_the_next_identical_post(gw: Gateway) -> None:
    # Two runs of one request, both queued before either completes (nothing cached yet).
    measured_id = (await gw.create()).json()["id"]
    predicted_id = (await gw.create()).json()["id"]
    await bus.publish_all(gw.nats_url, flow(measured_id))
    await gw.wait_status(measured_id, "completed")
    # A predicted answer of the same request does not replace the measured one.
    guess = RunCompleted(
        run_id=predicted_id,
        cache_hit=False,
        measured=False,
        winner=OTHER,
        candidates=[OTHER],
        pareto_front=["eagle3-tree"],
    )
    await bus.publish_all(
        gw.nats_url, [new_event(guess, tenant_id="acme", correlation_id=predicted_id, producer="predictor")]
    )
    await gw.wait_status(predicted_id, "completed")
    source = "SELECT source_run_id FROM winner_cache WHERE cache_scope = 'acme'"
    assert bus.sql(gw.dsn, source) == [(measured_id,)]

    hit = await gw.create(body=run_body(gpu="h100"))
    assert hit.status_code == 200, hit.text
    run = hit.json()
    assert run["cache_hit"] is True and run["measured"] is True
    assert run["winner"] == WINNER.model_dump(mode="json")
    # Another tenant's identical request does not see acme's winner (F-S1).
    assert (await gw.create("other", body=run_body(gpu="h100"))).status_code == 202


# --- SSE resume -----------------------------------------------------------------------------------


async def test_sse_resumes_after_last_event_id(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    await bus.publish_all(gw.nats_url, flow(run_id))
    await gw.wait_status(run_id, "completed")
    url = f"{RUNS}/{run_id}/events"
    resumed = await gw.client.get(url, headers=gw.auth(**{"Last-Event-ID": "2"}))
    assert resumed.status_code == 200
    assert resumed.headers["content-type"].startswith("text/event-stream")
    sse, _ = parse_sse(resumed.text)
    assert [(e["id"], e["event"]) for e in sse] == [
        ("3", "run.predicted"),
        ("4", "bench.rep_measured"),
        ("5", "run.completed"),
    ]
    envelope = json.loads(sse[-1]["data"])
    assert envelope["type"] == "run.completed" and envelope["correlation_id"] == run_id
    # Resuming after the terminal event ends at once with nothing to send.
    after_end = await gw.client.get(url, headers=gw.auth(**{"Last-Event-ID": "5"}))
    assert parse_sse(after_end.text)[0] == []
    assert_problem(await gw.client.get(url, headers=gw.auth(**{"Last-Event-ID": "x"})), 400)


async def test_sse_streams_live_events_with_keepalives(gw: Gateway) -> None:
    run_id = (await gw.create()).json()["id"]
    url = f"{RUNS}/{run_id}/events"
    # ASGITransport returns the body once the stream ends, i.e. at the terminal event.
    pending = asyncio.create_task(gw.client.get(url, headers=gw.auth("viewer")))
    await asyncio.sleep(0.8)  # idle longer than the 0.3 s keepalive interval
    await bus.publish_all(gw.nats_url, flow(run_id))
    response = await asyncio.wait_for(pending, WAIT_S)
    sse, comments = parse_sse(response.text)
    assert [e["event"] for e in sse][0] == "run.queued" and sse[-1]["event"] == "run.completed"
    assert "keepalive" in comments


# --- apply ----------------------------------------------------------------------------------------


async def completed_run(gw: Gateway) -> str:
    run_id: str = (await gw.create()).json()["id"]
    await bus.publish_all(gw.nats_url, flow(run_id))
    await gw.wait_status(run_id, "completed")
    return run_id


async def test_apply_for_each_engine(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    url = f"{RUNS}/{run_id}/apply"

    vllm = await gw.client.post(url, headers=gw.auth())  # empty body: the winner on the run's engine
    assert vllm.status_code == 200, vllm.text
    body = vllm.json()
    assert body["candidate_id"] == "ngram-k4" and body["config"]["engine"] == "vllm"
    assert body["config"]["method"] == "ngram" and body["config"]["num_speculative_tokens"] == 4
    assert body["cli_args"][0] == "--speculative-config"
    assert json.loads(body["cli_args"][1])["prompt_lookup_max"] == 4

    sglang = (await gw.client.post(url, json={"engine": "sglang"}, headers=gw.auth())).json()
    assert sglang["config"]["speculative_algorithm"] == "NGRAM"
    assert "--speculative-num-steps" in sglang["cli_args"]
    assert sglang["config"]["speculative_ngram_max_bfs_breadth"] == 1  # a chain, as measured

    speccore = (await gw.client.post(url, json={"engine": "speccore"}, headers=gw.auth())).json()
    assert speccore["config"]["candidate"] == NGRAM.model_dump(mode="json")
    assert speccore["cli_args"][:2] == ["--method", "ngram"]

    tree = await gw.client.post(
        url, json={"engine": "sglang", "candidate_id": "eagle3-tree"}, headers=gw.auth()
    )
    assert tree.json()["config"]["speculative_algorithm"] == "EAGLE3"
    assert tree.json()["config"]["speculative_eagle_topk"] == 4

    # vLLM takes no static tree; an unknown candidate is not in the table.
    no_tree = await gw.client.post(url, json={"candidate_id": "eagle3-tree"}, headers=gw.auth())
    assert "tree" in assert_problem(no_tree, 422)["detail"]
    missing = await gw.client.post(url, json={"candidate_id": "nope"}, headers=gw.auth())
    assert assert_problem(missing, 422)["errors"][0]["pointer"] == "#/candidate_id"

    # Apply is a POST like the others: a replay under its key returns the stored flags.
    keyed = gw.auth(**{"Idempotency-Key": "apply-1"})
    first = await gw.client.post(url, json={"engine": "sglang"}, headers=keyed)
    assert (await gw.client.post(url, json={"engine": "sglang"}, headers=keyed)).json() == first.json()


async def test_apply_needs_a_completed_run_with_a_winner(gw: Gateway) -> None:
    queued = (await gw.create()).json()["id"]
    assert (
        "queued"
        in assert_problem(await gw.client.post(f"{RUNS}/{queued}/apply", headers=gw.auth()), 409)["detail"]
    )

    no_winner = (await gw.create()).json()["id"]
    running = new_event(
        RunRunning(run_id=no_winner, stage="predicting"),
        tenant_id="acme",
        correlation_id=no_winner,
        producer="t",
    )
    empty = running.follow(
        RunCompleted(
            run_id=no_winner,
            cache_hit=False,
            measured=False,
            winner=None,
            candidates=[OTHER],
            pareto_front=[],
        ),
        producer="t",
    )
    await bus.publish_all(gw.nats_url, [running, empty])
    await gw.wait_status(no_winner, "completed")
    response = await gw.client.post(f"{RUNS}/{no_winner}/apply", headers=gw.auth())
    assert "without a winner" in assert_problem(response, 409)["detail"]


# --- bad input: 4xx problem+json, never a 5xx -----------------------------------------------------


async def test_unknown_model_and_gpu_are_422_naming_them(gw: Gateway) -> None:
    model = assert_problem(await gw.create(body=run_body(model_ref="acme/llama-9000")), 422)
    assert "acme/llama-9000" in model["detail"] and model["errors"][0]["pointer"] == "#/target/model_ref"
    gpu = assert_problem(await gw.create(body=run_body(gpu="TPU-v9")), 422)
    assert "TPU-v9" in gpu["detail"] and gpu["errors"][0]["pointer"] == "#/target/gpu"


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({**run_body(), "workload": {"fingerprint": "poetry"}}, "#/workload/fingerprint"),
        ({**run_body(), "mode": 7}, "#/mode"),
        ({**run_body(), "target": "llama"}, "#/target"),
        ({**run_body(), "goal": {"priorities": {"throughput": -1}}}, "#/goal/priorities/throughput"),
        ({**run_body(), "extra": True}, "#/extra"),
        ({"workload": {"fingerprint": "chat"}}, "#/target"),
        (run_body(engine_version="0.8\u0000"), "#/target/engine_version"),
    ],
)
async def test_invalid_bodies_are_422_with_a_pointer(gw: Gateway, body: Any, pointer: str) -> None:
    problem = assert_problem(await gw.create(body=body), 422)
    assert pointer in [e["pointer"] for e in problem["errors"]]


async def test_other_bad_requests(gw: Gateway) -> None:
    not_json = await gw.client.post(
        RUNS, content=b"{not json", headers=gw.auth(**{"Content-Type": "application/json"})
    )
    assert_problem(not_json, 422)
    assert_problem(await gw.create(body=[]), 422)
    assert_problem(await gw.client.get(f"{RUNS}/no-such-run", headers=gw.auth()), 404)
    assert_problem(await gw.client.get(f"{RUNS}/bad%20id%00", headers=gw.auth()), 404)
    assert_problem(await gw.client.get(f"{API_PREFIX}/nowhere", headers=gw.auth()), 404)
    assert_problem(await gw.client.delete(RUNS, headers=gw.auth()), 405)
    as_json = gw.auth(**{"Content-Type": "application/json"})
    assert_problem(await gw.client.post(f"{RUNS}/x/apply", content=b"[1]", headers=as_json), 422)


async def test_probes_and_openapi(gw: Gateway) -> None:
    assert (await gw.client.get("/healthz")).json() == {"status": "ok"}
    assert (await gw.client.get("/readyz")).json() == {"status": "ready"}
    schema = (await gw.client.get("/openapi.json")).json()
    post = schema["paths"][RUNS]["post"]
    assert set(post["responses"]) >= {"200", "202", "400", "401", "403", "409", "422"}
    assert list(post["responses"]["422"]["content"]) == [PROBLEM_MEDIA_TYPE]
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert "Idempotency-Key" in [p["name"] for p in post["parameters"]]


# --- fuzzing the OpenAPI schema over real HTTP ----------------------------------------------------


@pytest.fixture
def served(db: str, nats_url: str, tmp_path: Path) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    tokens = asyncio.run(issue_tokens(db))
    # Uploaded corpora go to the test's own artifact store.
    with ServerThread(create_app(gateway_settings(db, nats_url, artifact_dir=tmp_path))) as server:
        yield server, tokens


def test_fuzz_openapi_never_5xx(served: tuple[ServerThread, dict[str, str]]) -> None:
    """Schema-conforming and schema-violating requests to every operation get a declared answer."""
    server, tokens = served
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    auth = {"Authorization": f"Bearer {tokens['dev']}"}
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    # runs: 5, me: 1, probes: 2, tune-sessions: 6, datastores: 3, heads: 6, security: 2
    assert len(operations) == 25
    for operation in operations:
        fuzz(
            operation.as_strategy(generation_mode=GenerationMode.POSITIVE).map(known_target), server.url, auth
        )
        if operation.path_parameters or operation.headers or operation.body:
            fuzz(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE), server.url, auth)


@schemathesis.serializer("application/jsonl", "application/x-ndjson")
def _raw_body(ctx: Any, value: Any) -> bytes:
    """Upload bodies (POST datastores, POST heads/data) are raw text: sent as generated."""
    return value if isinstance(value, bytes) else str(value).encode()


def known_target(case: Any) -> Any:
    """Half the generated run requests name a real model and GPU, so they get past the catalog check
    and their other random fields reach the database."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("target"), dict) and len(repr(body)) % 2 == 0:
        body["target"] |= {"model_ref": "smollm2-135m-instruct", "gpu": "cpu"}
    return case


def fuzz(strategy: Any, base_url: str, auth: dict[str, str]) -> None:
    checks = [
        schemathesis.checks.not_a_server_error,
        schemathesis.checks.status_code_conformance,
        schemathesis.checks.content_type_conformance,
        schemathesis.checks.response_schema_conformance,
    ]

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=25,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def call(case: Any) -> None:
        # A valid token on every case (schemathesis generates random ones from the bearer
        # scheme), so the generated parameters and bodies reach validation and the handlers.
        case.headers = {**(case.headers or {}), **auth}
        response = case.call(base_url=base_url, timeout=10)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            assert response.headers["content-type"] == [PROBLEM_MEDIA_TYPE]
        case.validate_response(response, checks=checks)

    call()
