"""The quality-gate service on a real nats-server and PostgreSQL (and smollm2 for a measured gate)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import psycopg
import pytest
from fixtures import bus
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.envelope import Envelope, new_event
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from specops_schemas.api import Target
from specops_schemas.candidates import BASELINE_ID, Candidate, GateOutcome, Measurement
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import BenchCompleted, BenchPlan, CandidateFailure
from specops_services.quality_gate import db as gate_db
from specops_services.quality_gate.app import subscribe
from specops_services.quality_gate.decoding import LOSSY_OPTION
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import QualityGateSettings
from specplatform.db import Pool

TENANT = "acme"
MODEL = "smollm2-135m-instruct"
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=5.0)
# Tiny on purpose: 2 prompts x 12 tokens, decoded together.
SETTINGS = QualityGateSettings(gate_prompts=2, gate_new_tokens=12, gate_batch_size=2, threads=2)


def _measurement(candidate_id: str) -> Measurement:
    return Measurement(
        candidate_id=candidate_id,
        reps=1,
        tokens_per_s=20.0,
        tokens_per_s_stdev=0.0,
        speedup=1.0 if candidate_id == BASELINE_ID else 1.4,
        acceptance_rate=0.5,
        mean_acceptance_length=2.0,
        per_position_acceptance=[0.5],
        ttft_s=0.05,
        tpot_s=0.05,
        extra_memory_bytes=0,
    )


def _bench_completed(
    dsn: str,
    method: GateMethod,
    candidates: Sequence[Candidate],
    measured: Sequence[str],
    failed: Sequence[str] = (),
) -> Envelope[BenchCompleted]:
    """A bench of a run the gateway opened, as the benchmark-runner completes it."""
    run_id, bench_id = f"run-{uuid.uuid4().hex[:10]}", f"bench-{uuid.uuid4().hex[:10]}"
    bus.open_run(dsn, TENANT, run_id)
    plan = BenchPlan(
        run_id=run_id,
        target=Target(model_ref=MODEL, gpu="cpu", engine="speccore"),
        fingerprint="chat",
        mode="interactive",
        quality_gate=method,
        candidates=list(candidates),
        reps=1,
        n_prompts=2,
        max_new_tokens=16,
    )
    payload = BenchCompleted(
        bench_id=bench_id,
        plan=plan,
        baseline=_measurement(BASELINE_ID),
        results=[_measurement(cid) for cid in measured],
        failures=[
            CandidateFailure(candidate_id=cid, error_stage=ErrorStage.BENCHMARK, message="no tokens")
            for cid in failed
        ],
    )
    return new_event(payload, tenant_id=TENANT, correlation_id=run_id, producer="benchmark-runner")


class _Recording(GateRunner):
    """The real runner, noting which candidates it was asked to gate."""

    def __init__(self, models: ModelCache) -> None:
        super().__init__(SETTINGS, models)
        self.gated: list[str] = []

    def evaluate(
        self,
        plan: BenchPlan,
        candidate: Candidate,
        *,
        tenant_id: str | None = None,
        measured: Measurement | None = None,
    ) -> GateOutcome:
        self.gated.append(candidate.candidate_id)
        return super().evaluate(plan, candidate, tenant_id=tenant_id, measured=measured)


def _loader(calls: list[str], model: LoadedModel | None = None) -> Callable[[str, str, str], LoadedModel]:
    def load(ref: str, device: str, dtype: str) -> LoadedModel:
        calls.append(ref)
        if model is None:
            raise OSError(f"{ref}: no such model here")
        return model

    return load


@asynccontextmanager
async def _gate_service(db: str, nats_url: str, runner: GateRunner) -> AsyncIterator[str]:
    """The service's consumer and outbox relay on this test's database; yields its durable name."""

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, runner, service=service, retry=FAST, fetch_timeout_s=0.5)

    async with bus.serving(db, nats_url, "qg", register) as service:
        yield consumer_name(service, "gate_bench")


@pytest.mark.slow
async def test_measured_candidates_are_gated_once_on_the_target(
    db: str, nats_url: str, js: JetStreamContext, smollm: LoadedModel
) -> None:
    good = Candidate(candidate_id="ngram-k4", family="ngram", k=4)
    gated_before = Candidate(candidate_id="ngram-k8", family="ngram", k=8)
    unusable = Candidate(candidate_id="bad-opt", family="ngram", k=4, options={LOSSY_OPTION: "high"})
    unmeasured = Candidate(candidate_id="self6-k3", family="draft_model", draft="self:6", k=3)
    event = _bench_completed(
        db,
        GateMethod.TOPK5,
        [good, gated_before, unusable, unmeasured],
        measured=["ngram-k4", "ngram-k8", "bad-opt"],
        failed=["self6-k3"],
    )
    bench, run_id = event.payload, event.correlation_id
    # As if a previous delivery stored this verdict and then died.
    async with await psycopg.AsyncConnection.connect(db) as conn:
        before = GateOutcome(method=GateMethod.TOPK5, passed=True, score=1.0, threshold=0.95)
        kwargs = {"bench_id": bench.bench_id, "run_id": run_id, "candidate_id": "ngram-k8", "outcome": before}
        assert await gate_db.save_outcome(conn, **kwargs, evaluated_at=datetime.now(UTC))
        await conn.commit()

    loads: list[str] = []
    runner = _Recording(ModelCache(loader=_loader(loads, smollm)))
    async with _gate_service(db, nats_url, runner) as durable:
        await publish(js, event)
        verdicts = await bus.events(js, f"spec.gate.{bench.bench_id}.evaluated", at_least=2)
        running = await bus.events(js, f"spec.run.{run_id}.running", at_least=1)
        outbox_rows = len(bus.sql(db, "SELECT id FROM outbox"))

        # Published again under a new event id (the broker's dedup cannot catch it).
        again = event.model_copy(update={"event_id": str(uuid.uuid4())})
        await bus.acked(js, durable, await publish(js, again))
        assert len(bus.sql(db, "SELECT id FROM outbox")) == outbox_rows
        assert await bus.count(js, f"spec.gate.{bench.bench_id}.evaluated") == 2
        assert await bus.count(js, f"spec.run.{run_id}.running") == 1

    assert loads == [MODEL]
    assert runner.gated == ["ngram-k4", "bad-opt"]
    assert [e.payload.stage for e in running] == ["gating"]
    by_id = {e.payload.candidate_id: e for e in verdicts}
    assert sorted(by_id) == ["bad-opt", "ngram-k4"]
    for e in [*verdicts, *running]:
        assert (e.tenant_id, e.correlation_id, e.causation_id) == (TENANT, run_id, event.event_id)
    ok = by_id["ngram-k4"].payload
    assert (ok.method, ok.passed, ok.threshold) == (GateMethod.TOPK5, True, 0.95)
    assert ok.score is not None and ok.score >= 0.95
    refused = by_id["bad-opt"].payload
    assert refused.passed is False and LOSSY_OPTION in str(refused.details["error"])
    stored = bus.sql(db, "SELECT candidate_id, method, passed FROM gate_results ORDER BY candidate_id")
    assert stored == [("bad-opt", "topk5", False), ("ngram-k4", "topk5", True), ("ngram-k8", "topk5", True)]


async def test_a_skipped_gate_passes_for_the_audit_without_loading_a_model(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    event = _bench_completed(
        db,
        GateMethod.SKIPPED,
        [Candidate(candidate_id="ngram-k4", family="ngram", k=4)],
        measured=["ngram-k4"],
    )
    loads: list[str] = []
    async with _gate_service(db, nats_url, GateRunner(SETTINGS, ModelCache(loader=_loader(loads)))):
        await publish(js, event)
        [verdict] = await bus.events(js, f"spec.gate.{event.payload.bench_id}.evaluated", at_least=1)
        await bus.events(js, f"spec.run.{event.correlation_id}.running", at_least=1)

    assert loads == []
    outcome = verdict.payload
    assert (outcome.candidate_id, outcome.method, outcome.passed) == ("ngram-k4", GateMethod.SKIPPED, True)
    assert outcome.details["audit"] is True and outcome.details["measured"] is False
    assert bus.sql(db, "SELECT method, passed FROM gate_results") == [("skipped", True)]


async def test_a_target_that_cannot_load_fails_the_run_at_the_quality_gate(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    event = _bench_completed(
        db, GateMethod.TOPK5, [Candidate(candidate_id="ngram-k4", family="ngram", k=4)], measured=["ngram-k4"]
    )
    loads: list[str] = []
    async with _gate_service(db, nats_url, GateRunner(SETTINGS, ModelCache(loader=_loader(loads)))):
        await publish(js, event)
        [failed] = await bus.events(js, f"spec.run.{event.correlation_id}.failed", at_least=1)

    assert loads == [MODEL]
    assert failed.payload.error_stage == ErrorStage.QUALITY_GATE
    assert "no such model" in failed.payload.message
    assert await bus.count(js, f"spec.gate.{event.payload.bench_id}.evaluated") == 0
    assert bus.sql(db, "SELECT * FROM gate_results") == []
