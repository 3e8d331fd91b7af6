"""The head-trainer as its own process, killed with SIGKILL mid-epoch: the redelivered request
resumes from the checkpoint, publishes no epoch twice, and ends with the weights of an
uninterrupted run."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from fixtures import bus
from fixtures.process import service_process
from heads_data import head_requested
from nats.js import JetStreamContext

from specbus import consumer_name, publish
from speccatalog.artifacts import find_head, head_work_dir
from speccore.models import LoadedModel
from speccore.training.run import train_head
from speccore.training.trainer import CHECKPOINT
from specops_services.head_trainer import logic
from specops_services.head_trainer.app import HANDLER, SERVICE

TENANT = "acme"
CHECKPOINT_EVERY = 1
BATCH_TOKENS = 256  # many steps per epoch on 40 examples, so the kill lands mid-epoch
WAIT_S = 120.0


async def _first_checkpoint(work: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (work / CHECKPOINT).is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint written; trainer log:\n{log.read_text()[-4000:]}")
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_a_trainer_killed_mid_epoch_resumes_to_the_weights_of_an_uninterrupted_run(
    db: str, nats_url: str, js: JetStreamContext, smollm: LoadedModel, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    event = head_requested(root, TENANT)
    head_id = event.payload.head_id
    work = root / head_work_dir(TENANT, head_id)
    env = os.environ | {
        "NATS_URL": nats_url,
        "DATABASE_URL": db,
        "SPECOPS_STATE_DIR": str(tmp_path / "state"),
        "SPECOPS_ARTIFACT_DIR": str(root),
        "SPECOPS_MEASURE_LOCK_DIR": str(tmp_path / "locks"),
        "SPECOPS_HEAD_DEVICE": "cpu",
        "SPECOPS_HEAD_DTYPE": "float32",
        "SPECOPS_THREADS": "2",
        "SPECOPS_HEAD_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
        "SPECOPS_HEAD_BATCH_TOKENS": str(BATCH_TOKENS),
        # Redelivered 4 s after the trainer dies rather than the default 15 s.
        "SPECOPS_HEAD_ACK_WAIT_S": "4",
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    log = tmp_path / "trainer.log"
    ack = await publish(js, event)

    with service_process("head-trainer", log, env) as first:
        await _first_checkpoint(work, first, log)
        first.send_signal(signal.SIGKILL)
        first.wait()
    checkpoint = torch.load(work / CHECKPOINT, weights_only=False)
    killed_at = checkpoint["state"]
    # Killed inside the first epoch (its end not reached), after a checkpoint of it.
    assert killed_at["epoch"] == 0 and killed_at["batch"] >= 1
    assert await bus.count(js, f"spec.head.{head_id}.trained") == 0

    with service_process("head-trainer", log, env):
        [trained] = await bus.events(js, f"spec.head.{head_id}.trained", wait_s=WAIT_S)
        await bus.acked(js, consumer_name(SERVICE, HANDLER), ack)
        starts = await bus.events(js, f"spec.head.{head_id}.training_started", at_least=2)
        epochs = await bus.events(js, f"spec.head.{head_id}.epoch_completed", at_least=3)

    assert "resumed at step" in log.read_text()
    assert [s.payload.resumed_from_step for s in starts] == [None, killed_at["steps"]]
    # Each epoch once on the bus, under its derived id.
    assert [e.payload.epoch.epoch for e in epochs] == [0, 1, 2]
    assert [e.event_id for e in epochs] == [logic.event_id(head_id, f"epoch/{n}") for n in range(3)]

    # The same request trained in this process without interruption.
    plan = logic.head_plan(event, checkpoint_every=CHECKPOINT_EVERY, batch_tokens=BATCH_TOKENS)
    data = root / event.payload.train_path
    reference = train_head(smollm, plan, data, None, tmp_path / "reference", progress=False)
    weights = hashlib.sha256((tmp_path / "reference" / "head.safetensors").read_bytes()).hexdigest()
    directory = find_head(root, TENANT, head_id)
    assert directory is not None
    assert trained.payload.artifact.weights_sha256 == weights
    assert hashlib.sha256((directory / "head.safetensors").read_bytes()).hexdigest() == weights
    assert trained.payload.steps == reference.steps == epochs[2].payload.epoch.steps
    print(f"killed at step {killed_at['steps']} of {reference.steps}")
