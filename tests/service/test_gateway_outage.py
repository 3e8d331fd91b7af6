"""The gateway on uvicorn when what it relies on goes away: its database stopped (a 503 with
Retry-After, streams that end cleanly, the SDK waiting it out), a token revoked under an open
event stream."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest
from fixtures.gateway import RUNS, ServerThread, gateway_settings, issue_tokens, run_body
from fixtures.postgres import PrivatePostgres
from prometheus_client import REGISTRY

from specops.client import Retry, Run, SpecopsAPIError, SpeculativeClient
from specops_schemas.api import PROBLEM_MEDIA_TYPE
from specops_services.gateway.app import create_app
from specops_services.gateway.http import credentials
from specops_services.gateway.http.problems import DATABASE_UNAVAILABLE
from specops_services.gateway.http.sse import TOKEN_REVOKED

WAIT_S = 60.0
RUN_ROUTE = f"{RUNS}/{{run_id}}"


def _answered_503() -> float:
    labels = {"method": "GET", "route": RUN_ROUTE, "status": "503"}
    return REGISTRY.get_sample_value("specops_http_requests_total", labels) or 0.0


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {WAIT_S}s")
        time.sleep(0.05)


def test_a_database_outage_is_a_503_with_retry_after_and_the_sdk_waits_it_out(
    private_postgres: PrivatePostgres, empty_nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = private_postgres.url
    tokens = asyncio.run(issue_tokens(dsn))
    auth = {"Authorization": f"Bearer {tokens['dev']}"}
    settings = gateway_settings(dsn, empty_nats_url).model_copy(
        update={"gateway_retry_after_s": 1, "gateway_db_timeout_s": 1.0}
    )
    # uvicorn's own logger does not propagate: an "Exception in ASGI application" would go there.
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(caplog.handler)
    patient = Retry(max_wait_s=WAIT_S)
    try:
        with (
            ServerThread(create_app(settings)) as server,
            SpeculativeClient(server.url, tokens["dev"], retry=patient) as client,
            httpx.Client(base_url=server.url, headers=auth, timeout=WAIT_S) as http,
        ):
            run = client.runs.create(target=run_body()["target"], workload="chat")
            with http.stream("GET", f"{RUNS}/{run.id}/events") as stream:
                lines = stream.iter_lines()
                first = list(iter(lines.__next__, ""))
                assert "event: run.queued" in first
                private_postgres.stop()
                # The open stream ends, cleanly (no reset), when its next poll finds no database.
                rest = list(lines)
            assert "event: run.completed" not in rest

            response = http.get(f"{RUNS}/{run.id}")
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
            assert response.json()["type"] == DATABASE_UNAVAILABLE

            fetched: list[Run] = []
            waiting = threading.Thread(target=lambda: fetched.append(client.runs.get(run.id)))
            answered = _answered_503()
            waiting.start()
            _wait_for(lambda: _answered_503() > answered, "the SDK's request was not answered 503")
            assert private_postgres.start() == dsn
            waiting.join(WAIT_S)
            assert [r.id for r in fetched] == [run.id]
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    # One WARNING line per refused request, and no traceback anywhere.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("answered 503" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_revoking_a_token_ends_its_open_event_stream(db: str, nats_url: str) -> None:
    tokens = asyncio.run(issue_tokens(db))
    settings = gateway_settings(db, nats_url).model_copy(update={"gateway_sse_token_check_s": 0.2})
    with (
        ServerThread(create_app(settings)) as server,
        SpeculativeClient(server.url, tokens["dev"], retry=Retry(attempts=1)) as client,
    ):
        # Nothing runs it: the run stays queued and its stream would stay open.
        run = client.runs.create(target=run_body()["target"], workload="chat")
        events = client.runs.stream(run.id)
        assert next(events).type == "run.queued"
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(
                "UPDATE api_tokens SET revoked_at = now() WHERE secret_sha256 = %s",
                (credentials.hash_token(tokens["dev"]),),
            )
        with pytest.raises(SpecopsAPIError) as ended:
            next(events)
    assert ended.value.status == 401
    assert ended.value.problem.type == TOKEN_REVOKED
