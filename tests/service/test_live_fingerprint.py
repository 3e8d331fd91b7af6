"""`"fingerprint": "auto"` without samples, from live traffic (issue 44,
ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT): `specops serve engine` (its own process, smollm2, real
NATS) summarizes a tenant's requests and publishes the summary on
`spec.workload.<tenant>.summarized`, without their text; the gateway keeps it, and the tenant's
auto run on that target completes as the fingerprint its traffic shows. Another tenant, with no
summary of its own, gets a 422 that says what to do; so does any tenant without the flag."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures import bus
from fixtures.engine import engine_server
from fixtures.gateway import run_body, running_gateway
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker
from specbus.envelope import new_event
from specops.commands.serve_engine import AUTO_FINGERPRINT_ENV
from specops_schemas.api import PROBLEM_MEDIA_TYPE
from specops_schemas.serve import WorkloadSummarized
from specops_services.gateway.live_workload import latest
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool, create_pool, tenant_transaction

MODEL = "smollm2-135m-instruct"
SERVER_ID = "live-test"
EVERY = 4  # K: a summary every K requests of a tenant
CODE_PROMPTS = [
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards."""\n',
    "import json\n\n\ndef load(path):\n    with open(path) as fp:\n        return json.load(fp)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    'def mean(values: list[float]) -> float:\n    """Arithmetic mean."""\n    return',
]


def predictor(db: str, nats_url: str) -> AbstractAsyncContextManager[str]:
    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        retry = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
        subscribe(broker, pool, Planner(host=HostInfo(cuda=False)), service=service, retry=retry)

    return bus.serving(db, nats_url, "pred", register)


async def _stored(db: str, tenant: str, model_ref: str) -> None:
    """Wait until the gateway holds a live summary of the tenant's traffic on the model."""
    pool = create_pool(db, max_size=1)
    await pool.open()
    try:
        for _ in range(300):
            async with pool.connection() as conn, tenant_transaction(conn, tenant):
                if await latest(conn, tenant, model_ref) is not None:
                    return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"no live summary of {tenant} on {model_ref} was stored")
    finally:
        await pool.close()


def auto_body(model_ref: str = MODEL) -> dict[str, Any]:
    # Not measurable here (a vLLM deployment on an H100): the predictor answers it.
    body = run_body(model_ref=model_ref, gpu="H100-80GB", engine="vllm")
    body["workload"] = {"fingerprint": "auto"}
    return body


@pytest.mark.slow
async def test_live_code_traffic_makes_an_auto_run_code(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTO_FINGERPRINT_ENV, "1")
    args = ["--model", MODEL, "--nats-url", nats_url, "--server-id", SERVER_ID]
    args += ["--fingerprint-every", str(EVERY)]
    gateway = running_gateway(db, nats_url, enable_auto_workload_fingerprint=True)
    async with gateway as gw, predictor(db, nats_url):
        with engine_server(args, tmp_path / "engine.log") as engine:
            headers = {"X-Specops-Tenant": "acme"}
            async with httpx.AsyncClient(base_url=engine.url, headers=headers, timeout=120) as client:
                for prompt in CODE_PROMPTS:
                    r = await client.post(
                        "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
                    )
                    assert r.status_code == 200, r.text
            [event] = await bus.events(js, "spec.workload.acme.summarized")
        await _stored(db, "acme", MODEL)

        created = await gw.create(body=auto_body())
        assert created.status_code == 202, created.text
        completed = await gw.wait_status(created.json()["id"], "completed")
        refused = await gw.create("other", body=auto_body())

    summary = event.payload
    assert isinstance(summary, WorkloadSummarized)
    assert (summary.tenant, summary.model_ref, summary.server_id) == ("acme", MODEL, SERVER_ID)
    assert summary.requests == EVERY and "is_palindrome" not in event.model_dump_json()
    workload = completed["request"]["workload"]
    assert workload["fingerprint"] == "code"
    inferred = workload["inferred"]
    assert inferred["source"] == "live" and inferred["samples"] == EVERY
    assert 0 < inferred["runner_up_confidence"] < inferred["confidence"] <= 1
    # globex has served nothing through the engine server: acme's summary is not its own.
    assert refused.status_code == 422 and refused.headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert "no engine server has summarized" in refused.json()["detail"]


def _summary(tenant: str, model_ref: str) -> Any:
    payload = WorkloadSummarized(
        server_id=SERVER_ID,
        tenant=tenant,
        model_ref=model_ref,
        requests=8,
        span_s=30.0,
        probability_sums={"code": 7.0, "chat": 1.0},  # type: ignore[dict-item]
        observed=8,
    )
    return new_event(payload, tenant_id=tenant, correlation_id=SERVER_ID, producer="engine")


async def test_an_auto_run_without_samples_is_refused_without_its_own_summary(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # acme's traffic on smollm2 only; a summary claiming acme sent as globex's is not kept.
    forged = _summary("acme", MODEL).model_copy(update={"tenant_id": "globex"})
    await bus.publish_all(nats_url, [forged, _summary("acme", MODEL)])
    async with running_gateway(db, nats_url, enable_auto_workload_fingerprint=True) as gw:
        await _stored(db, "acme", MODEL)
        other_tenant = await gw.create("other", body=auto_body())
        other_model = await gw.create(body=auto_body("meta-llama/Llama-3.1-70B-Instruct"))
        own = await gw.create(body=auto_body())
    async with running_gateway(db, nats_url) as gw:
        flag_off = await gw.create(body=auto_body())

    for refused in (other_tenant, other_model):
        assert refused.status_code == 422 and refused.headers["content-type"] == PROBLEM_MEDIA_TYPE
        detail = refused.json()["detail"]
        assert "no engine server has summarized" in detail and "workload.samples" in detail
    assert "meta-llama/Llama-3.1-70B-Instruct" in other_model.json()["detail"]
    assert own.status_code == 202 and own.json()["request"]["workload"]["fingerprint"] == "code"
    assert flag_off.status_code == 422
    assert AUTO_FINGERPRINT_ENV in flag_off.json()["detail"]
