"""The head-trainer service on a real nats-server, PostgreSQL and smollm2."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import huggingface_hub.constants
import pytest
from fixtures import bus
from fixtures.speculators import INSTALL, load_config_classes
from heads_data import MODEL, head_requested
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.subjects import STREAM, dlq_subject
from speccatalog.artifacts import find_head, head_digest, head_work_dir
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from specops_schemas.catalog import ErrorStage
from specops_services.head_trainer import logic
from specops_services.head_trainer.app import HANDLER, subscribe
from specops_services.head_trainer.settings import HeadTrainerSettings
from specops_services.head_trainer.training import HeadTrainer
from specplatform.db import Pool

TENANT = "acme"
# ack_wait well below the time training takes here: heartbeats must keep the message.
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=2.0)


def _settings(tmp_path: Path) -> HeadTrainerSettings:
    return HeadTrainerSettings(
        head_device="cpu",
        head_dtype="float32",
        threads=2,
        artifact_dir=tmp_path / "artifacts",
        measure_lock_dir=tmp_path / "locks",
        state_dir=tmp_path / "state",
    )


def _loader(calls: list[str], model: LoadedModel) -> Callable[[str, str, str], LoadedModel]:
    def load(ref: str, device: str, dtype: str) -> LoadedModel:
        calls.append(ref)
        return model

    return load


def _trainer_service(db: str, nats_url: str, trainer: HeadTrainer) -> AbstractAsyncContextManager[str]:
    """The service's consumer and outbox relay in this process; yields its service name."""

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe(broker, pool, trainer, service=service, retry=FAST, fetch_timeout_s=0.5)

    return bus.serving(db, nats_url, "ht", register)


@pytest.mark.slow
async def test_a_head_is_trained_announced_per_epoch_and_stored_by_its_digest(
    db: str, nats_url: str, js: JetStreamContext, smollm: LoadedModel, tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    root = settings.artifact_root
    event = head_requested(root, TENANT)
    head_id = event.payload.head_id
    loads: list[str] = []
    trainer = HeadTrainer(settings, ModelCache(loader=_loader(loads, smollm)))
    async with _trainer_service(db, nats_url, trainer) as service:
        durable = consumer_name(service, HANDLER)
        await bus.acked(js, durable, await publish(js, event), wait_s=120)
        [started] = await bus.events(js, f"spec.head.{head_id}.training_started")
        epochs = await bus.events(js, f"spec.head.{head_id}.epoch_completed", at_least=3)
        [trained] = await bus.events(js, f"spec.head.{head_id}.trained")
        assert (await js.consumer_info(STREAM, durable)).num_redelivered == 0
        outbox_rows = len(bus.sql(db, "SELECT id FROM outbox"))

        # The same request again, under a new event id: the head is in the store, so it is
        # not trained again, and its head.trained is queued again with the same id.
        again = event.model_copy(update={"event_id": str(uuid.uuid4())})
        await bus.acked(js, durable, await publish(js, again))
        assert len(bus.sql(db, "SELECT id FROM outbox")) == outbox_rows
        assert await bus.count(js, f"spec.head.{head_id}.trained") == 1
        assert await bus.count(js, f"spec.head.{head_id}.training_started") == 1

    assert loads == [MODEL]
    assert started.payload.resumed_from_step is None and "(cpu)" in started.payload.hardware
    assert [e.payload.epoch.epoch for e in epochs] == [0, 1, 2]
    assert [e.event_id for e in epochs] == [logic.event_id(head_id, f"epoch/{n}") for n in range(3)]
    assert epochs[0].payload.epoch.train_loss is None and epochs[0].payload.epoch.steps == 0
    assert all(e.payload.epoch.train_loss is not None for e in epochs[1:])
    assert epochs[2].payload.epoch.steps > epochs[1].payload.epoch.steps > 0
    for e in [started, *epochs, trained]:
        assert (e.tenant_id, e.correlation_id, e.causation_id) == (TENANT, head_id, event.event_id)
        assert e.producer == "head-trainer"

    done = trained.payload
    assert trained.event_id == logic.event_id(head_id, "trained")
    assert done.request == event.payload.request and done.train_path == event.payload.train_path
    assert done.stopped_by == "epochs" and done.steps == epochs[2].payload.epoch.steps
    directory = find_head(root, TENANT, head_id)
    assert directory is not None and directory.name == head_digest(directory)
    artifact = done.artifact
    assert (artifact.sha256, artifact.path) == (directory.name, f"heads/{TENANT}/{directory.name}")
    weights = (directory / "head.safetensors").read_bytes()
    assert artifact.weights_sha256 == hashlib.sha256(weights).hexdigest()
    config = json.loads((directory / "config.json").read_text())
    assert config["provenance"]["head_id"] == head_id
    assert artifact.target_weights == config["provenance"]["target_weights"]
    assert (artifact.num_heads, artifact.eagle_version) == (4, None) and artifact.params > 0
    # The work dir (and its checkpoint) is gone.
    assert not (root / head_work_dir(TENANT, head_id)).exists()


@pytest.mark.slow
async def test_an_eagle3_head_is_exported_for_vllm_as_part_of_training(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    smollm: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The export sits in the head's digest dir, names the target's Hugging Face id as its
    verifier, and is what the speculators package's own config classes load."""
    monkeypatch.setenv("ENABLE_L4_EAGLE3_TRAINING", "1")
    settings = _settings(tmp_path)
    root = settings.artifact_root
    event = head_requested(root, TENANT, lines=16, family="eagle3", epochs=1, max_len=64, draft_vocab=512)
    head_id = event.payload.head_id
    trainer = HeadTrainer(settings, ModelCache(loader=_loader([], smollm)))
    async with _trainer_service(db, nats_url, trainer) as service:
        await bus.acked(js, consumer_name(service, HANDLER), await publish(js, event), wait_s=300)
        [trained] = await bus.events(js, f"spec.head.{head_id}.trained")

    artifact = trained.payload.artifact
    directory = find_head(root, TENANT, head_id)
    assert directory is not None and artifact.eagle_version == 3
    export = artifact.speculators
    assert export is not None and export.path == f"heads/{TENANT}/{directory.name}/speculators"
    assert export.verifier == "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = json.loads((root / export.path / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == export.verifier
    assert config["specops_provenance"]["head_id"] == head_id
    classes = load_config_classes()
    if classes is None:
        pytest.skip(f"speculators is not installed ({INSTALL})")
    loaded = classes.model.from_pretrained(str(root / export.path), local_files_only=True)
    assert isinstance(loaded, classes.eagle3) and loaded.draft_vocab_size == 512


OVERLAP = b'{"prompt": "hi", "completion": "hello"}\n'


@pytest.mark.parametrize(
    ("text", "request_fields", "found"),
    [
        (b'{"prompt": "hi", "completion": "hello"}\n{"prompt": 1\n', {}, ":2"),
        (b"\n\n", {}, "no examples"),
        (None, {"family": "eagle3"}, "ENABLE_L4_EAGLE3_TRAINING"),
        (OVERLAP, {"heldout": OVERLAP}, "also in the training data"),
    ],
    ids=["bad-jsonl", "empty", "eagle3-flag", "heldout-overlaps"],
)
async def test_a_head_that_cannot_be_trained_fails_at_once(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    text: bytes | None,
    request_fields: dict[str, str],
    found: str,
) -> None:
    monkeypatch.delenv("ENABLE_L4_EAGLE3_TRAINING", raising=False)
    settings = _settings(tmp_path)
    event = head_requested(settings.artifact_root, TENANT, text=text, **request_fields)
    head_id = event.payload.head_id
    loads: list[str] = []
    trainer = HeadTrainer(settings, ModelCache(loader=_loader(loads, None)))  # type: ignore[arg-type]
    async with _trainer_service(db, nats_url, trainer) as service:
        durable = consumer_name(service, HANDLER)
        await bus.acked(js, durable, await publish(js, event))
        [failed] = await bus.events(js, f"spec.head.{head_id}.failed")
        info = await js.consumer_info(STREAM, durable)
        # Redelivered (a new event id): the request failed already, nothing is queued again.
        outbox_rows = len(bus.sql(db, "SELECT id FROM outbox"))
        again = event.model_copy(update={"event_id": str(uuid.uuid4())})
        await bus.acked(js, durable, await publish(js, again))
        assert len(bus.sql(db, "SELECT id FROM outbox")) == outbox_rows

    assert failed.payload.error_stage == ErrorStage.VALIDATION
    assert found in failed.payload.message and str(tmp_path) not in failed.payload.message
    assert failed.event_id == logic.event_id(head_id, "failed")
    assert loads == []  # decided before the target loads
    assert info.num_redelivered == 0 and info.num_ack_pending == 0
    assert await bus.count(js, dlq_subject(service)) == 0
    assert await bus.count(js, f"spec.head.{head_id}.training_started") == 0


async def test_a_target_that_cannot_load_fails_the_head(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline, an unknown Hugging Face id fails at once instead of after the hub's retries.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    settings = _settings(tmp_path)
    event = head_requested(settings.artifact_root, TENANT, target="no-such-org/no-such-model")
    async with _trainer_service(db, nats_url, HeadTrainer(settings, ModelCache())) as service:
        durable = consumer_name(service, HANDLER)
        await bus.acked(js, durable, await publish(js, event))
        [failed] = await bus.events(js, f"spec.head.{event.payload.head_id}.failed")
        info = await js.consumer_info(STREAM, durable)
    assert failed.payload.error_stage == ErrorStage.MODEL_LOAD
    assert "no-such-org/no-such-model" in failed.payload.message
    assert info.num_redelivered == 0
