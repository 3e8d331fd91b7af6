"""The predictor offers T3 heads, on a real nats-server and PostgreSQL: a tenant's heads as
head.transitioned moves them (production: offered and always measured; uat: only when a run
asks; deprecated: no more; another tenant's: never), and the published EAGLE-3 heads in vLLM
runs of their target."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from fixtures import bus
from nats.js import JetStreamContext
from psycopg.types.json import Jsonb

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.envelope import Envelope, new_event
from speccatalog.artifacts import head_artifact_path, new_head_id
from specops_schemas.api import RunCreateRequest
from specops_schemas.events import RunRequested
from specops_schemas.heads import HeadArtifact, HeadTransition, HeadTransitioned, SpeculatorsExport
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool

SMOLLM = "smollm2-135m-instruct"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
T0 = datetime(2026, 11, 25, 12, tzinfo=UTC)


def _request(
    model: str = SMOLLM, gpu: str = "cpu", engine: str = "speccore", **extra: Any
) -> RunCreateRequest:
    body = {"target": {"model_ref": model, "gpu": gpu, "engine": engine}, "workload": {"fingerprint": "chat"}}
    return RunCreateRequest.model_validate(body | extra)


def _requested(dsn: str, tenant: str, request: RunCreateRequest) -> Envelope[RunRequested]:
    run_id = str(uuid.uuid4())
    bus.sql(dsn, "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING", (tenant, tenant))
    bus.sql(
        dsn,
        "INSERT INTO runs (id, tenant_id, request) VALUES (%s, %s, %s)",
        (run_id, tenant, Jsonb(request.model_dump(mode="json"))),
    )
    payload = RunRequested(run_id=run_id, request=request, requested_by="token-1")
    return new_event(payload, tenant_id=tenant, correlation_id=run_id, producer="gateway")


def _moved(
    tenant: str, head_id: str, before: str, after: str, minutes: int, *, family: str = "medusa"
) -> Envelope[HeadTransitioned]:
    """A move of a head trained for smollm2; an eagle3 one with the export the head-trainer writes."""
    digest = uuid.uuid5(uuid.NAMESPACE_URL, head_id).hex * 2
    export = None
    if family == "eagle3":
        export = SpeculatorsExport(
            path=f"{head_artifact_path(tenant, digest)}/speculators",
            verifier="HuggingFaceTB/SmolLM2-135M-Instruct",
            speculative_tokens=3,
            speculators_version="0.9.0",
        )
    payload = HeadTransitioned(
        head_id=head_id,
        tenant_target=SMOLLM,
        family=family,  # type: ignore[arg-type]
        transition=HeadTransition(
            from_state=before,  # type: ignore[arg-type]
            to_state=after,  # type: ignore[arg-type]
            actor="token-admin",
            role="admin",
            rationale="measured on our traffic",
            at=T0 + timedelta(minutes=minutes),
        ),
        artifact=HeadArtifact(
            sha256=digest,
            path=head_artifact_path(tenant, digest),
            weights_sha256=digest,
            target_weights="fp",
            num_heads=3,
            eagle_version=3 if family == "eagle3" else None,
            params=1_000_000,
            speculators=export,
        ),
        acceptance_rate=0.55,
        mean_acceptance_length=2.1,
    )
    return new_event(payload, tenant_id=tenant, correlation_id=head_id, producer="gateway")


@asynccontextmanager
async def _predictor(db: str, nats_url: str) -> AsyncIterator[str]:
    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        host = HostInfo(cuda=False)
        subscribe(broker, pool, Planner(host=host), service=service, retry=FAST, fetch_timeout_s=0.5)

    async with bus.serving(db, nats_url, "predh", register) as service:
        yield service


async def _plan(
    js: JetStreamContext, db: str, tenant: str, request: RunCreateRequest, *, measured_here: bool = True
) -> tuple[set[str], set[str]]:
    """The drafts of a run's ranked candidates and of its bench's candidates."""
    requested = _requested(db, tenant, request)
    run_id = requested.correlation_id
    await publish(js, requested)
    [predicted] = await bus.events(js, f"spec.run.{run_id}.predicted")
    ranked = {c.candidate.draft or "" for c in predicted.payload.candidates}
    if not measured_here:
        await bus.events(js, f"spec.run.{run_id}.completed")
        return ranked, set()
    benches = [e for e in await bus.events(js, "spec.bench.*.requested") if e.correlation_id == run_id]
    measured = {c.draft or "" for b in benches for c in b.payload.plan.candidates}
    return ranked, measured


async def test_a_tenants_production_head_is_offered_and_measured_in_its_runs_only(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    head = new_head_id()
    async with _predictor(db, nats_url) as service:
        durable = consumer_name(service, "head_transitioned")
        await bus.acked(js, durable, await publish(js, _moved("tenant-a", head, "uat", "production", 1)))
        ranked, measured = await _plan(js, db, "tenant-a", _request())
        assert head in ranked and head in measured
        ranked_b, measured_b = await _plan(js, db, "tenant-b", _request())
        assert head not in ranked_b and head not in measured_b
        # Deprecated: offered no more; a late (older) move does not bring it back.
        await bus.acked(
            js, durable, await publish(js, _moved("tenant-a", head, "production", "deprecated", 3))
        )
        await bus.acked(js, durable, await publish(js, _moved("tenant-a", head, "validated", "uat", 0)))
        ranked, _ = await _plan(js, db, "tenant-a", _request())
        assert head not in ranked
    assert bus.sql(db, "SELECT state, acceptance_rate FROM predictor_heads WHERE head_id = %s", (head,)) == [
        ("deprecated", 0.55)
    ]


async def test_a_uat_head_is_offered_only_to_runs_that_ask(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    head = new_head_id()
    async with _predictor(db, nats_url) as service:
        durable = consumer_name(service, "head_transitioned")
        await bus.acked(js, durable, await publish(js, _moved("tenant-a", head, "validated", "uat", 1)))
        ranked, _ = await _plan(js, db, "tenant-a", _request())
        assert head not in ranked
        ranked, measured = await _plan(js, db, "tenant-a", _request(include_uat_heads=True))
        assert head in ranked and head in measured


async def test_a_vllm_run_of_llama_8b_lists_the_published_eagle3_head(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with _predictor(db, nats_url):
        request = _request(LLAMA_8B, gpu="H100-80GB", engine="vllm")
        # vLLM is not measured here: the answer is predicted.
        ranked, _ = await _plan(js, db, "tenant-a", request, measured_here=False)
    assert "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in ranked


async def test_an_exported_eagle3_head_is_offered_to_vllm_runs_of_its_target(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    eagle3, medusa = new_head_id(), new_head_id()
    async with _predictor(db, nats_url) as service:
        durable = consumer_name(service, "head_transitioned")
        for head, family in ((eagle3, "eagle3"), (medusa, "medusa")):
            moved = _moved("tenant-a", head, "uat", "production", 1, family=family)
            await bus.acked(js, durable, await publish(js, moved))
        # vLLM is not measured here: the answer is predicted, from the offered candidates.
        request = _request(gpu="H100-80GB", engine="vllm")
        ranked, _ = await _plan(js, db, "tenant-a", request, measured_here=False)
        assert eagle3 in ranked and medusa not in ranked
        sglang, _ = await _plan(
            js, db, "tenant-a", _request(gpu="H100-80GB", engine="sglang"), measured_here=False
        )
        assert not {eagle3, medusa} & sglang
    [(path,)] = bus.sql(db, "SELECT speculators_path FROM predictor_heads WHERE head_id = %s", (eagle3,))
    assert path.endswith("/speculators")
