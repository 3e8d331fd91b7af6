"""The product spec's T1 and T2 flows as its text writes them (issue 44), against the gateway and
the predictor on real NATS and PostgreSQL, over real HTTP.

Example 1 (Llama-3.1-70B chat on "a single H100-80GB", vLLM): its curl, as written, sends its
JSON as a form (`curl -d`) and is told which header to add; with it, the run is planned, states
that bf16 does not fit one H100 and what it assumed, and completes with a predicted winner (vLLM
on an H100 cannot be measured on this host). The SDK snippet runs as written but for the
import path. docs/guides/seed-examples.md says where and why each flow differs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fixtures import bus
from fixtures.gateway import ServerThread, gateway_settings, issue_tokens
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker
from specops.client import SpeculativeClient
from specops_schemas.api import API_PREFIX
from specops_schemas.events import RunPredicted
from specops_services.gateway.app import create_app
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
# The seed's `-d '{...}'` of "How to run a T1 experiment", but for its line breaks.
SEED_T1_BODY = (
    '{"target": {"model_ref": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "H100-80GB", '
    '"engine": "vllm", "engine_version": "0.8.0"}, "workload": {"fingerprint": "chat"}, '
    '"mode": "interactive", '
    '"goal": {"quality_gate": "topk5", "priorities": {"throughput": 0.7, "latency": 0.3}}}'
)
CURL_FORM = "application/x-www-form-urlencoded"  # what `curl -d` sends without -H
JSON = "application/json"


@asynccontextmanager
async def _stack(db: str, nats_url: str) -> AsyncIterator[str]:
    """The predictor's consumers and the gateway under uvicorn; yields the gateway's URL."""

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        fast = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
        subscribe(broker, pool, Planner(host=HostInfo(cuda=False)), service=service, retry=fast)

    async with bus.serving(db, nats_url, "pred", register):
        with ServerThread(create_app(gateway_settings(db, nats_url))) as server:
            yield server.url


def _curl(url: str, path: str, body: str, token: str | None, content_type: str) -> httpx.Response:
    """`curl -X POST url+path -H ... -d body`, as the seed writes it (a token only where it sends one)."""
    headers = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(f"{url}{API_PREFIX}{path}", content=body, headers=headers)


def _sdk_example_1(url: str, token: str) -> dict[str, object]:
    """The seed's "Python SDK equivalent", as written, but for the import and the client's address."""
    client = SpeculativeClient(url, token)
    run = client.runs.create(
        target={"model_ref": LLAMA_70B, "gpu": "H100-80GB", "engine": "vllm"},
        workload={"fingerprint": "chat"},
        mode="interactive",
        goal={"quality_gate": "topk5"},
    )
    events = list(client.runs.stream(run.id))
    done = client.runs.get(run.id)
    winner = done.winner
    applied = client.runs.apply(run.id)  # Hands off to spec 13 apply pipeline.
    again = client.runs.create(
        target={"model_ref": LLAMA_70B, "gpu": "H100-80GB", "engine": "vllm"},
        workload={"fingerprint": "chat"},
        mode="interactive",
        goal={"quality_gate": "topk5"},
    )
    client.close()
    return {"run": run, "events": events, "done": done, "winner": winner, "applied": applied, "again": again}


async def test_example_1_and_the_t2_curl_as_the_seed_writes_them(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    token = (await issue_tokens(db))["dev"]
    async with _stack(db, nats_url) as url:
        # The curl as written: `-d` without a Content-Type is told which header to add.
        refused = await asyncio.to_thread(_curl, url, "/runs", SEED_T1_BODY, token, CURL_FORM)
        accepted = await asyncio.to_thread(_curl, url, "/runs", SEED_T1_BODY, token, JSON)
        sdk = await asyncio.to_thread(_sdk_example_1, url, token)
        t1_run = sdk["run"].id  # type: ignore[attr-defined]
        t2_body = json.dumps({"run_id": t1_run, "budget_minutes": 60})
        t2_as_written = await asyncio.to_thread(_curl, url, "/tune-sessions", t2_body, token, CURL_FORM)
        t2_with_header = await asyncio.to_thread(_curl, url, "/tune-sessions", t2_body, token, JSON)

    assert refused.status_code == 415, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert "-H 'Content-Type: application/json'" in refused.json()["detail"]
    assert accepted.status_code == 202, accepted.text
    assert accepted.headers["location"].startswith(f"{API_PREFIX}/runs/")

    types = [e.type for e in sdk["events"]]  # type: ignore[attr-defined]
    assert types == ["run.queued", "run.running", "run.predicted", "run.completed"], types
    predicted = next(e.payload for e in sdk["events"] if isinstance(e.payload, RunPredicted))  # type: ignore[attr-defined]
    assert predicted.fit is not None and predicted.fit.planned_gpus == 2
    done = sdk["done"]
    fit = done.fit  # type: ignore[attr-defined]
    assert fit is not None and fit == predicted.fit
    assert (
        not fit.fits_as_requested and "1 x H100-80GB offers 72.0 GiB usable: it does not fit" in fit.summary
    )
    assert any(o.startswith("FP8 weights on 1 x H100-80GB") for o in fit.options)
    assert any("set target.gpu_count to 2" in o for o in fit.options)
    # vLLM on an H100 is not measured on this host: the winner is the predicted best, marked so.
    assert done.measured is False and sdk["winner"] is not None  # type: ignore[attr-defined]
    assert sdk["applied"].cli_args[0] == "--speculative-config"  # type: ignore[attr-defined]
    # The identical request again is answered from the winner cache on the POST itself.
    again = sdk["again"]
    assert again.status == "completed" and again.cache_hit is True  # type: ignore[attr-defined]

    assert t2_as_written.status_code == 415, t2_as_written.text
    # T2 tunes by measuring; a run whose winner was only predicted cannot seed it.
    assert t2_with_header.status_code == 409, t2_with_header.text
    assert "measured" in t2_with_header.json()["detail"]
