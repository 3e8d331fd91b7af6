"""The SDK (specops.client) and `specops run` against the real gateway on uvicorn, real PostgreSQL and NATS.

The rest of the pipeline is played by the test: it publishes the events predictor,
benchmark-runner and quality gate would, and the gateway's projector records them.
Transport failures (a dropped stream, a 503) are staged with httpx.MockTransport.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fixtures import bus
from fixtures.gateway import ServerThread, gateway_settings
from psycopg.types.json import Jsonb

from specbus.envelope import Envelope, new_event
from specops.client import (
    TOKEN_ENV,
    URL_ENV,
    Retry,
    RunTimeoutError,
    SpecopsAPIError,
    SpecopsConnectionError,
    SpecopsError,
    SpeculativeClient,
    save_token,
)
from specops.commands import apply as apply_cli
from specops.commands import run as run_cli
from specops_schemas.candidates import (
    BASELINE_ID,
    Candidate,
    CandidateResult,
    GateOutcome,
    Measurement,
    Prediction,
    RankedCandidate,
)
from specops_schemas.catalog import Family, GateMethod, Role
from specops_schemas.events import (
    BenchCompleted,
    BenchPlan,
    BenchRepMeasured,
    BenchRequested,
    GateEvaluated,
    RepMetrics,
    RunCompleted,
    RunPredicted,
    RunRunning,
)
from specops_schemas.security import OPT_OUT_REASON
from specops_services.gateway.app import create_app
from specops_services.gateway.http.tokens import issue_token

WAIT_S = 15.0
FAST = Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.05)
TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
T1_TYPES = [
    "run.queued",
    "run.running",
    "run.predicted",
    "run.running",
    "bench.requested",
    "bench.rep_measured",
    "bench.rep_measured",
    "bench.completed",
    "gate.evaluated",
    "run.completed",
]


# --- the gateway on uvicorn -----------------------------------------------------------------------


class Stack:
    def __init__(self, url: str, dsn: str, nats_url: str, tokens: dict[str, str]) -> None:
        self.url, self.dsn, self.nats_url, self.tokens = url, dsn, nats_url, tokens

    def client(self, who: str = "dev", **options: Any) -> SpeculativeClient:
        return SpeculativeClient(self.url, self.tokens[who], retry=FAST, **options)


@pytest.fixture
def stack(db: str, nats_url: str) -> Iterator[Stack]:
    async def tokens() -> dict[str, str]:
        dev = await issue_token(db, tenant_id="acme", role=Role.DEVELOPER)
        viewer = await issue_token(db, tenant_id="acme", role=Role.VIEWER)
        return {"dev": dev.secret, "viewer": viewer.secret}

    issued = asyncio.run(tokens())
    with ServerThread(create_app(gateway_settings(db, nats_url))) as server:
        yield Stack(server.url, db, nats_url, issued)


# --- what predictor, benchmark-runner and quality gate publish ----------------------------------

NGRAM = Candidate(candidate_id="ngram-k4", family=Family.NGRAM, k=4, options={"ngram_max": 4})
LOOKAHEAD = Candidate(candidate_id="lookahead-k5", family=Family.LOOKAHEAD, k=5)


def prediction(rank: int, speedup: float) -> Prediction:
    return Prediction(
        rank=rank,
        score=speedup,
        acceptance_rate=0.4,
        mean_acceptance_length=1.6,
        speedup=speedup,
        extra_memory_bytes=0,
    )


def measurement(candidate_id: str, speedup: float) -> Measurement:
    return Measurement(
        candidate_id=candidate_id,
        reps=1,
        tokens_per_s=10.0 * speedup,
        tokens_per_s_stdev=0.0,
        speedup=speedup,
        acceptance_rate=0.33,
        mean_acceptance_length=1.6,
        per_position_acceptance=[0.5, 0.3, 0.2, 0.1],
        ttft_s=0.1,
        tpot_s=0.08,
        extra_memory_bytes=0,
    )


def rep_metrics(tokens_per_s: float) -> RepMetrics:
    return RepMetrics(
        prompt_tokens=30,
        new_tokens=48,
        verify_steps=30,
        drafted_tokens=60,
        accepted_tokens=20,
        rollbacks=10,
        draft_time_s=0.01,
        verify_time_s=4.0,
        ttft_s=0.1,
        total_time_s=48 / tokens_per_s,
        extra_memory_bytes=0,
        drafted_per_position=[15, 15, 15, 15],
        accepted_per_position=[8, 6, 4, 2],
        acceptance_rate=0.33,
        mean_acceptance_length=1.6,
        per_position_acceptance=[0.53, 0.4, 0.27, 0.13],
        tpot_s=0.08,
        tokens_per_s=tokens_per_s,
    )


GATE = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95)
WINNER = CandidateResult(
    candidate=NGRAM, prediction=prediction(1, 1.3), measurement=measurement("ngram-k4", 1.22), gate=GATE
)
RUNNER_UP = CandidateResult(candidate=LOOKAHEAD, prediction=prediction(2, 1.1))


def t1_flow(run_id: str, tenant: str = "acme") -> list[Envelope[Any]]:
    """queued is the gateway's; then running, predicted, measuring, per-rep, gate, completed."""
    bench_id = f"b-{run_id[:12]}"
    running = new_event(
        RunRunning(run_id=run_id, stage="predicting"),
        tenant_id=tenant,
        correlation_id=run_id,
        producer="predictor",
    )
    predicted = running.follow(
        RunPredicted(
            run_id=run_id,
            candidates=[
                RankedCandidate(candidate=NGRAM, prediction=WINNER.prediction),
                RankedCandidate(candidate=LOOKAHEAD, prediction=RUNNER_UP.prediction),
            ],
            pareto_front=["ngram-k4"],
        ),
        producer="predictor",
    )
    measuring = predicted.follow(RunRunning(run_id=run_id, stage="measuring"), producer="predictor")
    plan = BenchPlan.model_validate(
        {
            "run_id": run_id,
            "target": TARGET,
            "fingerprint": "chat",
            "mode": "interactive",
            "quality_gate": "topk5",
            "candidates": [NGRAM],
            "reps": 1,
            "n_prompts": 3,
            "max_new_tokens": 48,
        }
    )
    requested = measuring.follow(BenchRequested(bench_id=bench_id, plan=plan), producer="predictor")
    base = requested.follow(
        BenchRepMeasured(
            bench_id=bench_id, candidate_id=BASELINE_ID, rep=0, reps=1, metrics=rep_metrics(10.0)
        ),
        producer="benchmark-runner",
    )
    rep = base.follow(
        BenchRepMeasured(
            bench_id=bench_id, candidate_id="ngram-k4", rep=0, reps=1, metrics=rep_metrics(12.2), speedup=1.22
        ),
        producer="benchmark-runner",
    )
    benched = rep.follow(
        BenchCompleted(
            bench_id=bench_id,
            plan=plan,
            baseline=measurement(BASELINE_ID, 1.0),
            results=[measurement("ngram-k4", 1.22)],
        ),
        producer="benchmark-runner",
    )
    gated = benched.follow(
        GateEvaluated(bench_id=bench_id, candidate_id="ngram-k4", **GATE.model_dump()),
        producer="quality-gate",
    )
    completed = gated.follow(
        RunCompleted(
            run_id=run_id,
            cache_hit=False,
            measured=True,
            winner=WINNER,
            candidates=[WINNER, RUNNER_UP],
            pareto_front=["ngram-k4"],
        ),
        producer="predictor",
    )
    return [running, predicted, measuring, requested, base, rep, benched, gated, completed]


def publish_all(nats_url: str, events: list[Envelope[Any]], delay_s: float = 0.0) -> None:
    """bus.publish_all from the test's synchronous code and threads."""
    asyncio.run(bus.publish_all(nats_url, events, delay_s=delay_s))


def opted_out_flow(run_id: str, tenant: str = "acme") -> list[Envelope[Any]]:
    """What the predictor publishes for a run of a tenant that opted out of speculation (F-S3)."""
    running = new_event(
        RunRunning(run_id=run_id, stage="predicting"),
        tenant_id=tenant,
        correlation_id=run_id,
        producer="predictor",
    )
    answer = RunCompleted(
        run_id=run_id,
        cache_hit=False,
        measured=False,
        winner=None,
        candidates=[],
        pareto_front=[],
        speculation_disabled=OPT_OUT_REASON,
    )
    return [running, running.follow(answer, producer="predictor")]


def complete_runs_in_background(
    stack: Stack, count: int = 1, flow: Callable[[str], list[Envelope[Any]]] = t1_flow
) -> threading.Thread:
    """Plays the pipeline (`flow`) for the next `count` runs the gateway queues (found in its database)."""

    def play() -> None:
        done: set[str] = set()
        deadline = time.monotonic() + WAIT_S
        while len(done) < count and time.monotonic() < deadline:
            with psycopg.connect(stack.dsn) as conn:
                queued = [row[0] for row in conn.execute("SELECT id FROM runs WHERE status = 'queued'")]
            for run_id in set(queued) - done:
                publish_all(stack.nats_url, flow(run_id), delay_s=0.02)
                done.add(run_id)
            time.sleep(0.05)

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def seed_winner_cache(dsn: str, tenant: str = "acme") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO winner_cache (cache_scope, model_ref, gpu, engine, engine_version, fingerprint,
                   mode, quality_gate, winner, candidates, pareto_front, measured)
               VALUES (%s, 'smollm2-135m-instruct', 'cpu', 'speccore', '', 'chat', 'interactive', 'topk5',
                   %s, %s, %s, true)""",
            (
                tenant,
                Jsonb(WINNER.model_dump(mode="json")),
                Jsonb([WINNER.model_dump(mode="json"), RUNNER_UP.model_dump(mode="json")]),
                Jsonb(["ngram-k4"]),
            ),
        )


# --- SDK against the gateway ----------------------------------------------------------------------


def test_create_stream_get_apply(stack: Stack) -> None:
    with stack.client() as client:
        run = client.runs.create(
            target=TARGET, workload={"fingerprint": "chat"}, goal={"quality_gate": "topk5"}
        )
        assert run.status == "queued" and run.cache_hit is False
        assert run.request.target.model_ref == "smollm2-135m-instruct"
        # Published while the stream is open: the events arrive live, in order, then it ends.
        player = threading.Thread(target=publish_all, args=(stack.nats_url, t1_flow(run.id), 0.05))
        player.start()
        events = list(client.runs.stream(run.id))
        player.join()
        assert [e.type for e in events] == T1_TYPES
        assert [e.id for e in events] == [str(i) for i in range(1, len(T1_TYPES) + 1)]
        predicted = events[2].payload
        assert isinstance(predicted, RunPredicted) and predicted.candidates[0].candidate == NGRAM
        rep = events[6].payload
        assert isinstance(rep, BenchRepMeasured) and rep.speedup == 1.22
        assert events[-1].terminal and events[-1].data["correlation_id"] == run.id

        done = client.runs.get(run.id)
        assert done.status == "completed" and done.winner == WINNER and done.measured is True
        assert client.runs.wait(run.id, timeout=1.0) == done

        vllm = client.runs.apply(run.id, engine="vllm")
        assert vllm.candidate_id == "ngram-k4" and vllm.config.engine == "vllm"
        assert vllm.cli_args[0] == "--speculative-config"
        assert json.loads(vllm.cli_args[1])["num_speculative_tokens"] == 4
        speccore = client.runs.apply(run.id)  # the run's own engine
        assert speccore.config.engine == "speccore" and speccore.cli_args[:2] == ["--method", "ngram"]


def test_stream_resumes_after_last_event_id(stack: Stack) -> None:
    with stack.client("viewer") as viewer, stack.client() as client:
        run = client.runs.create(target=TARGET, workload="chat")
        publish_all(stack.nats_url, t1_flow(run.id))
        client.runs.wait(run.id, timeout=WAIT_S, poll_s=0.05)
        resumed = list(viewer.runs.stream(run.id, last_event_id=8))
        assert [(e.id, e.type) for e in resumed] == [("9", "gate.evaluated"), ("10", "run.completed")]
        assert list(viewer.runs.stream(run.id, last_event_id=10)) == []


def test_cache_hit_is_completed_on_the_post(stack: Stack) -> None:
    seed_winner_cache(stack.dsn)
    with stack.client() as client:
        # The POST's own answer is the completed run: nothing to wait for (no timing threshold
        # here; a loaded host made one flaky).
        run = client.runs.create(target=TARGET, workload="chat")
        assert run.status == "completed" and run.cache_hit is True and run.winner == WINNER
        assert [e.type for e in client.runs.stream(run.id)] == ["run.queued", "run.completed"]


def test_idempotency_key_makes_a_retried_create_one_run(stack: Stack) -> None:
    with stack.client() as client:
        first = client.runs.create(target=TARGET, workload="chat", idempotency_key="retry-me")
        again = client.runs.create(target=TARGET, workload="chat", idempotency_key="retry-me")
        fresh = client.runs.create(target=TARGET, workload="chat")
    assert again.id == first.id and fresh.id != first.id
    with psycopg.connect(stack.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (2,)


def test_errors_carry_the_problem(stack: Stack) -> None:
    with stack.client() as client:
        with pytest.raises(SpecopsAPIError) as unknown_model:
            client.runs.create(target=TARGET | {"model_ref": "acme/llama-9000"}, workload="chat")
        assert unknown_model.value.status == 422 and "acme/llama-9000" in (unknown_model.value.detail or "")
        assert unknown_model.value.problem.errors is not None
        assert unknown_model.value.problem.errors[0].pointer == "#/target/model_ref"

        with pytest.raises(SpecopsAPIError) as missing:
            client.runs.get("r-no-such-run")
        assert missing.value.status == 404 and missing.value.title == "Not Found"

        queued = client.runs.create(target=TARGET, workload="chat")
        with pytest.raises(SpecopsAPIError) as not_done:
            client.runs.apply(queued.id)
        assert not_done.value.status == 409
        with pytest.raises(RunTimeoutError):
            client.runs.wait(queued.id, timeout=0.2, poll_s=0.05)

    with stack.client("viewer") as viewer, pytest.raises(SpecopsAPIError) as forbidden:
        viewer.runs.create(target=TARGET, workload="chat")
    assert forbidden.value.status == 403
    with (
        SpeculativeClient(stack.url, "spk_not-a-token", retry=FAST) as stranger,
        pytest.raises(SpecopsAPIError) as unauthorized,
    ):
        stranger.runs.get(queued.id)
    assert unauthorized.value.status == 401


def test_invalid_arguments_fail_before_sending(stack: Stack) -> None:
    with stack.client() as client, pytest.raises(ValueError, match="fingerprint"):
        client.runs.create(target=TARGET, workload="poetry")


# --- transport failures, staged -------------------------------------------------------------------


class _Dropped(httpx.SyncByteStream):
    """A response body that sends `chunks` and then loses the connection."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("connection reset by peer")


def sse(seq: int, event_type: str, run_id: str = "r-1") -> bytes:
    data = json.dumps({"type": event_type, "correlation_id": run_id})
    return f"id: {seq}\nevent: {event_type}\ndata: {data}\n\n".encode()


def test_dropped_stream_reconnects_with_last_event_id() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("last-event-id"))
        headers = {"content-type": "text/event-stream"}
        if len(seen) == 1:
            # Event 3 is cut mid-way: it must come again, whole, after the reconnect.
            chunks = [
                sse(1, "run.queued"),
                b": keepalive\n\n",
                sse(2, "run.running"),
                sse(3, "run.predicted")[:20],
            ]
            return httpx.Response(200, headers=headers, stream=_Dropped(chunks))
        if len(seen) == 2:
            return httpx.Response(503, json={"title": "Service Unavailable", "status": 503})
        return httpx.Response(200, headers=headers, content=sse(3, "run.predicted") + sse(4, "run.completed"))

    with SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client:
        events = list(client.runs.stream("r-1"))
    assert [(e.id, e.type) for e in events] == [
        ("1", "run.queued"),
        ("2", "run.running"),
        ("3", "run.predicted"),
        ("4", "run.completed"),
    ]
    assert seen == [None, "2", "2"]
    # These bodies are not full envelopes: the SDK keeps the JSON and leaves `envelope` empty.
    assert events[0].envelope is None and events[0].data["type"] == "run.queued"


def test_a_stream_that_keeps_dropping_gives_up() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Dropped([]))

    with (
        SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client,
        pytest.raises(SpecopsConnectionError, match="connection reset"),
    ):
        list(client.runs.stream("r-1"))


def test_create_retries_503_and_connection_errors_with_one_key(stack: Stack) -> None:
    keys: list[str] = []
    upstream = httpx.Client(base_url=stack.url)

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        if len(keys) == 1:
            raise httpx.ConnectError("connection refused")
        if len(keys) == 2:
            return httpx.Response(
                503, headers={"retry-after": "0"}, json={"title": "Unavailable", "status": 503}
            )
        forwarded = upstream.send(
            upstream.build_request(
                request.method, request.url.path, headers=request.headers, content=request.content
            )
        )
        forwarded.read()
        return httpx.Response(forwarded.status_code, headers=forwarded.headers, content=forwarded.content)

    with stack.client(transport=httpx.MockTransport(handler)) as client:
        run = client.runs.create(target=TARGET, workload="chat")
    upstream.close()
    assert len(keys) == 3 and len(set(keys)) == 1
    assert run.status == "queued"


def _unavailable(retry_after: str) -> httpx.Response:
    body = {"title": "Service Unavailable", "status": 503}
    return httpx.Response(503, headers={"retry-after": retry_after}, json=body)


def test_retry_after_is_honoured_past_the_attempts_while_the_wait_allows() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return _unavailable("0") if len(calls) < 6 else httpx.Response(200, json={})

    patient = Retry(attempts=2, backoff_s=0.01, max_backoff_s=0.01, max_wait_s=WAIT_S)
    with SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=patient) as client:
        assert client.request("GET", "/anything").status_code == 200
    assert len(calls) == 6


def test_a_retry_after_beyond_the_wait_allowed_is_not_waited_for() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return _unavailable("30")

    hasty = Retry(max_wait_s=1.0)
    with (
        SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=hasty) as client,
        pytest.raises(SpecopsAPIError) as err,
    ):
        client.request("GET", "/anything")
    assert err.value.status == 503 and len(calls) == 1


def test_a_post_without_an_idempotency_key_is_never_sent_twice() -> None:
    calls: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("idempotency-key"))
        # Each POST's first try is refused; only the one with a key is tried again.
        return _unavailable("0") if len(calls) <= 2 else httpx.Response(200, json={})

    with SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client:
        with pytest.raises(SpecopsAPIError):
            client.request("POST", "/anything", json_body={})
        assert client.request("POST", "/anything", json_body={}, headers={"Idempotency-Key": '"k"'})
    assert calls == [None, '"k"', '"k"']


def test_no_gateway_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        SpeculativeClient(f"http://127.0.0.1:{port}", "t", retry=FAST) as client,
        pytest.raises(SpecopsConnectionError) as err,
    ):
        client.runs.get("r-1")
    assert err.value.url == f"http://127.0.0.1:{port}"


def test_defaults_come_from_the_environment_then_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (URL_ENV, TOKEN_ENV, "SPECOPS_GATEWAY_HOST", "SPECOPS_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
    with SpeculativeClient(state_dir=tmp_path) as client:
        assert client.base_url == "http://127.0.0.1:8787" and client.token is None
        assert "authorization" not in client.http.headers

    saved = save_token("spk_saved\n", tmp_path)
    assert saved.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("SPECOPS_GATEWAY_HOST", "0.0.0.0")
    monkeypatch.setenv("SPECOPS_GATEWAY_PORT", "9999")
    with SpeculativeClient(state_dir=tmp_path) as client:
        assert client.base_url == "http://127.0.0.1:9999" and client.token == "spk_saved"
        assert client.http.headers["authorization"] == "Bearer spk_saved"

    monkeypatch.setenv(URL_ENV, "https://specops.example/")
    monkeypatch.setenv(TOKEN_ENV, "spk_env")
    with SpeculativeClient(state_dir=tmp_path) as client:
        assert (client.base_url, client.token) == ("https://specops.example", "spk_env")


def test_stream_reads_the_event_stream_format() -> None:
    body = "\n".join(
        [
            ": keepalive",
            "",
            "id: 7",
            "event: run.predicted",
            "data: {",
            'data:  "a": 1}',
            "retry: 100",
            "",
            "",
            ": keepalive",
            "",
            "id: 8",
            "event: run.completed",
            "data: {}",
            "",
            "id: 9",
            "event: run.queued",
            "data: never sent: the stream ended at run.completed",
            "",
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    with SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client:
        events = list(client.runs.stream("r-1"))
    assert [(e.id, e.type, e.data) for e in events] == [
        ("7", "run.predicted", {"a": 1}),
        ("8", "run.completed", {}),
    ]


def test_a_stream_that_is_not_an_event_stream_is_an_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html>login</html>")

    with (
        SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client,
        pytest.raises(SpecopsError, match="answered text/html, not an event stream"),
    ):
        list(client.runs.stream("r-1"))


def test_a_stream_refused_for_good_is_the_gateways_problem() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(404, json={"title": "Not Found", "status": 404, "detail": "no run r-1"})

    with (
        SpeculativeClient("http://gw", "t", transport=httpx.MockTransport(handler), retry=FAST) as client,
        pytest.raises(SpecopsAPIError, match="no run r-1"),
    ):
        list(client.runs.stream("r-1"))
    assert len(calls) == 1


# --- specops run ------------------------------------------------------------------------------------


def cli(stack: Stack, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(
        [
            "run",
            "--model",
            "smollm2-135m-instruct",
            "--gpu",
            "cpu",
            "--engine",
            "speccore",
            "--fingerprint",
            "chat",
            "--url",
            stack.url,
            "--token",
            stack.tokens["dev"],
            *extra,
        ]
    )


def test_run_command_follows_the_run_and_prints_the_winner(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    player = complete_runs_in_background(stack)
    args = cli(stack, "--apply")
    assert args.handler(args) == 0
    player.join()
    out, err = capsys.readouterr()
    progress = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]
    assert progress[:3] == ["queued", "running: predicting", progress[2]]
    assert progress[2].startswith("predicted 2 candidates; top: ngram-k4 1.30x")
    assert "rep 1/1 ngram-k4: 12.2 tok/s, 1.22x, acceptance 0.33, mean acceptance length 1.60" in progress
    assert "gate ngram-k4: topk5 pass (score 0.99, threshold 0.95)" in progress
    assert progress[-1] == "completed: winner ngram-k4 (measured)"
    winner = dict(line.split(None, 1) for line in out.splitlines()[2:11] if " " in line)
    assert winner["winner"] == "ngram-k4" and winner["family"] == "ngram" and winner["k"] == "4"
    assert winner["speedup"].startswith("1.22x measured")
    assert re.search(r"^cache hit +false$", out, re.MULTILINE)
    assert "* ngram-k4" in out and "  lookahead-k5" in out
    assert "apply (speccore, ngram-k4): --method ngram --k 4" in out


def test_run_command_says_why_an_opted_out_run_has_no_winner(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    player = complete_runs_in_background(stack, flow=opted_out_flow)
    args = cli(stack, "--apply")
    assert args.handler(args) == 0
    player.join()
    out, err = capsys.readouterr()
    progress = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]
    assert progress[-1] == f"completed without speculation: {OPT_OUT_REASON}"
    assert f"nothing to apply: {OPT_OUT_REASON}" in err
    assert out.splitlines()[1] == f"no winner: {OPT_OUT_REASON}"
    assert "beats" not in out + err


def test_run_command_json_on_a_cache_hit(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    seed_winner_cache(stack.dsn)
    args = cli(stack, "--json", "--apply")
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    run_line, apply_line = out.splitlines()
    run = json.loads(run_line)
    assert run["status"] == "completed" and run["cache_hit"] is True
    assert run["winner"]["candidate"]["candidate_id"] == "ngram-k4"
    assert json.loads(apply_line)["config"]["engine"] == "speccore"
    assert err == ""


def test_run_command_errors_are_one_line(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parser = argparse.ArgumentParser()
    run_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    base = [
        "run",
        "--model",
        "smollm2-135m-instruct",
        "--gpu",
        "cpu",
        "--engine",
        "speccore",
        "--fingerprint",
        "chat",
    ]
    nowhere = parser.parse_args([*base, "--url", f"http://127.0.0.1:{port}", "--token", "t"])
    assert nowhere.handler(nowhere) == 2
    assert capsys.readouterr().err == (
        f"specops run: error: no gateway at http://127.0.0.1:{port}: run `specops up` (or pass --url)\n"
    )

    bad_token = parser.parse_args([*base, "--url", stack.url, "--token", "spk_nope"])
    assert bad_token.handler(bad_token) == 2
    err = capsys.readouterr().err
    assert err.startswith("specops run: error: Unauthorized (401)") and "specops tokens create" in err
    assert err.count("\n") == 1

    unknown = parser.parse_args(
        [*base[:2], "acme/llama-9000", *base[3:], "--url", stack.url, "--token", stack.tokens["dev"]]
    )
    assert unknown.handler(unknown) == 2
    assert "acme/llama-9000" in capsys.readouterr().err


# --- specops apply --run ----------------------------------------------------------------------------


def test_apply_command_prints_a_runs_winner_and_its_launch(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_winner_cache(stack.dsn)
    with stack.client() as client:
        run = client.runs.create(target=TARGET, workload="chat")
    auth = ["--url", stack.url, "--token", stack.tokens["dev"]]
    parser = argparse.ArgumentParser()
    apply_cli.add_parsers(parser.add_subparsers(dest="command", required=True))

    text = parser.parse_args(["apply", "--run", run.id, *auth])
    assert text.handler(text) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "apply (speccore, ngram-k4): --method ngram --k 4"
    assert out[-1] == "launch: specops serve engine --model smollm2-135m-instruct --method ngram --k 4"

    as_json = parser.parse_args(["apply", "--run", run.id, "--engine", "vllm", "--json", *auth])
    assert as_json.handler(as_json) == 0
    applied = json.loads(capsys.readouterr().out)
    assert applied["run_id"] == run.id and applied["candidate_id"] == "ngram-k4"
    flags = json.loads(applied["cli_args"][1])
    assert applied["cli_args"][0] == "--speculative-config"
    assert flags["method"] == "ngram" and flags["num_speculative_tokens"] == 4
    assert applied["launch"][:3] == ["vllm", "serve", "smollm2-135m-instruct"]
