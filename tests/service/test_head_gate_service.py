"""The quality gate on T3 heads, on a real nats-server and PostgreSQL: a Medusa head trained
in-process on smollm2 (speccore.training.run.train_head, ~40 examples, 1 epoch), put in the
artifact store as the head-trainer leaves it, then `head.trained` -> `head.gated`."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from fixtures import bus
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.envelope import Envelope, new_event
from speccatalog.artifacts import (
    HEAD_FILES,
    head_artifact_path,
    head_data_path,
    head_digest,
    head_work_dir,
    new_head_id,
)
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel, file_sha256
from speccore.training.data import write_examples
from speccore.training.features import target_fingerprint
from speccore.training.run import HeadPlan, train_head
from specops_schemas.heads import HeadArtifact, HeadGateSpec, HeadTrained, HeadTrainRequest
from specops_services.quality_gate.app import subscribe
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import QualityGateSettings
from specplatform.db import Pool
from specprompts.examples import sharegpt_examples

pytestmark = pytest.mark.slow

TENANT = "acme"
MODEL = "smollm2-135m-instruct"
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=10.0)
GATE = HeadGateSpec(min_acceptance=0.0, n_prompts=2, max_new_tokens=12, reps=1)


class Store(NamedTuple):
    root: Path
    head_id: str
    artifact: HeadArtifact
    train_path: str
    heldout_path: str


@pytest.fixture(scope="module")
def store(smollm: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """An artifact store holding a trained head (as the head-trainer leaves it) and its data."""
    root = tmp_path_factory.mktemp("artifacts")
    examples = sharegpt_examples(44, seed=5)
    train, held = root / "train.tmp", root / "held.tmp"
    write_examples(train, examples[:40])
    write_examples(held, examples[40:])
    paths = {}
    for name, src in (("train", train), ("held", held)):
        rel = head_data_path(TENANT, file_sha256(src))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(src, root / rel)
        paths[name] = rel
    head_id = new_head_id()
    work = root / head_work_dir(TENANT, head_id)
    plan = HeadPlan(
        family="medusa", epochs=1, max_len=128, draft_vocab=2048, num_heads=2, extra={"head_id": head_id}
    )
    train_head(smollm, plan, root / paths["train"], root / paths["held"], work, progress=False)
    digest = head_digest(work)
    final = root / head_artifact_path(TENANT, digest)
    final.mkdir(parents=True)
    for name in HEAD_FILES:
        shutil.copy(work / name, final / name)
    artifact = HeadArtifact(
        sha256=digest,
        path=head_artifact_path(TENANT, digest),
        weights_sha256=file_sha256(final / "head.safetensors"),
        target_weights=target_fingerprint(smollm),
        num_heads=2,
        params=1,
    )
    return Store(root, head_id, artifact, paths["train"], paths["held"])


def _renamed(store: Store) -> Store:
    """The same weights registered as another head (its own artifact digest, so its own verdict)."""
    head_id = new_head_id()
    src = store.root / store.artifact.path
    staging = store.root / head_work_dir(TENANT, head_id)
    staging.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    config["provenance"]["head_id"] = head_id
    (staging / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "head.safetensors", staging / "head.safetensors")
    digest = head_digest(staging)
    shutil.copytree(staging, store.root / head_artifact_path(TENANT, digest))
    artifact = store.artifact.model_copy(
        update={"sha256": digest, "path": head_artifact_path(TENANT, digest)}
    )
    return store._replace(head_id=head_id, artifact=artifact)


def _trained(store: Store, gate: HeadGateSpec) -> Envelope[HeadTrained]:
    request = HeadTrainRequest(
        target=MODEL,
        family="medusa",
        train_data="0" * 64,
        epochs=1,
        num_heads=2,
        draft_vocab=2048,
        max_len=128,
        gate=gate,
    )
    payload = HeadTrained(
        head_id=store.head_id,
        request=request,
        train_path=store.train_path,
        heldout_path=store.heldout_path,
        artifact=store.artifact,
        stopped_by="epochs",
        steps=1,
        tokens_seen=1,
        train_seconds=1.0,
    )
    return new_event(payload, tenant_id=TENANT, correlation_id=store.head_id, producer="head-trainer")


@asynccontextmanager
async def _gate(db: str, nats_url: str, runner: GateRunner) -> AsyncIterator[str]:
    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, runner, service=service, retry=FAST, fetch_timeout_s=0.5)

    async with bus.serving(db, nats_url, "qgh", register) as service:
        yield consumer_name(service, "head_trained")


def _runner(root: Path, smollm: LoadedModel, tmp_path: Path) -> GateRunner:
    settings = QualityGateSettings(threads=2, artifact_dir=root, measure_lock_dir=tmp_path / "locks")
    models = ModelCache(1, loader=lambda ref, device, dtype: smollm)
    return GateRunner(settings, models)


async def test_a_trained_head_is_gated_lossless_once(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    smollm: LoadedModel,
    store: Store,
    tmp_path: Path,
) -> None:
    root, head_id = store.root, store.head_id
    event = _trained(store, GATE)
    async with _gate(db, nats_url, _runner(root, smollm, tmp_path)) as durable:
        await publish(js, event)
        [gated] = await bus.events(js, f"spec.head.{head_id}.gated", at_least=1)
        # Redelivered, or sent again as a new event for the same artifact: no second verdict.
        await bus.acked(js, durable, await publish(js, event))
        again = event.model_copy(  # a new event id, the same head and artifact
            update={
                "event_id": new_event(
                    event.payload, tenant_id=TENANT, correlation_id=head_id, producer="head-trainer"
                ).event_id
            }
        )
        await bus.acked(js, durable, await publish(js, again))
        assert await bus.count(js, f"spec.head.{head_id}.trained") == 2  # the broker dropped the copy
        assert await bus.count(js, f"spec.head.{head_id}.gated") == 1
        assert len(bus.sql(db, "SELECT id FROM outbox")) == 1
    result = gated.payload.result
    assert result.passed and result.lossless, result.reason
    assert result.n_prompts == 2 and result.max_new_tokens == 12
    assert 0.0 <= result.acceptance_rate <= 1.0 and result.speedup > 0
    assert gated.payload.artifact == event.payload.artifact
    assert gated.producer == "quality-gate" and gated.causation_id == event.event_id


async def test_a_head_below_min_acceptance_is_not_passed_and_the_reason_names_the_numbers(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    smollm: LoadedModel,
    store: Store,
    tmp_path: Path,
) -> None:
    store = _renamed(store)
    root, head_id = store.root, store.head_id
    event = _trained(store, GATE.model_copy(update={"min_acceptance": 0.99}))
    async with _gate(db, nats_url, _runner(root, smollm, tmp_path)):
        await publish(js, event)
        [gated] = await bus.events(js, f"spec.head.{head_id}.gated", at_least=1)
    result = gated.payload.result
    assert not result.passed and result.lossless
    assert f"acceptance rate {result.acceptance_rate:.3f} < min_acceptance 0.990" in result.reason


async def test_a_missing_artifact_fails_the_head_at_the_gate(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    smollm: LoadedModel,
    store: Store,
    tmp_path: Path,
) -> None:
    store = _renamed(store)
    root, head_id = store.root, store.head_id
    event = _trained(store, GATE).model_copy(update={"tenant_id": "someone-else"})
    async with _gate(db, nats_url, _runner(root, smollm, tmp_path)):
        await publish(js, event)
        [failed] = await bus.events(js, f"spec.head.{head_id}.failed", at_least=1)
    assert failed.payload.error_stage == "quality_gate"
    assert "someone-else" in failed.payload.message
    assert await bus.count(js, f"spec.head.{head_id}.gated") == 0
