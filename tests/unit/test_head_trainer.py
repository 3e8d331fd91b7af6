"""The head-trainer's pure decisions (logic.py) and its files in the artifact store (store.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from heads_data import head_requested
from safetensors.torch import save_file

from speccatalog.artifacts import find_head, head_digest
from speccore.errors import SpecError
from speccore.training.trainer import CHECKPOINT, EpochReport
from specops_schemas.catalog import ErrorStage
from specops_services.head_trainer import logic, store
from specops_services.head_trainer.logic import Failure

TENANT = "acme"


def _report(epoch: int) -> EpochReport:
    loss = None if epoch == 0 else 1.5
    return EpochReport(
        epoch, 3 * epoch, 300 * epoch, loss, {"chain_mean_acceptance_length": 1.2}, 0.5 * epoch
    )


def _head_dir(directory: Path, head_id: str, *, family: str = "medusa", stopped_by: str = "epochs") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"w": torch.ones(3, 4, dtype=torch.float16), "draft_ids": torch.arange(5)}
    save_file(tensors, str(directory / "head.safetensors"))
    provenance = {
        "head_id": head_id,
        "target_weights": "sha256:abc",
        "steps": 7,
        "tokens_seen": 900,
        "stopped_by": stopped_by,
        "train_seconds": 3.5,
    }
    config = {"format": "specops-head/1", "family": family, "num_heads": 3, "provenance": provenance}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_the_plan_is_the_request_plus_the_hosts_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    event = head_requested(tmp_path, TENANT, epochs=3, lr=0.01, seed=4, num_heads=2, budget_minutes=5.0)
    plan = logic.head_plan(event, checkpoint_every=7, batch_tokens=1024)
    assert (plan.family, plan.epochs, plan.lr, plan.seed, plan.num_heads) == ("medusa", 3, 0.01, 4, 2)
    assert (plan.max_len, plan.draft_vocab, plan.budget_minutes) == (128, 2048, 5.0)
    assert (plan.checkpoint_every, plan.batch_tokens) == (7, 1024)
    assert plan.extra == {"head_id": event.payload.head_id}
    eagle3 = head_requested(tmp_path, TENANT, family="eagle3")
    monkeypatch.delenv("ENABLE_L4_EAGLE3_TRAINING", raising=False)
    with pytest.raises(SpecError, match="ENABLE_L4_EAGLE3_TRAINING"):
        logic.head_plan(eagle3, checkpoint_every=25, batch_tokens=4096)
    monkeypatch.setenv("ENABLE_L4_EAGLE3_TRAINING", "1")
    assert logic.head_plan(eagle3, checkpoint_every=25, batch_tokens=4096).family == "eagle3"


def test_epoch_trained_and_failed_ids_follow_the_head_not_the_delivery(tmp_path: Path) -> None:
    event = head_requested(tmp_path, TENANT)
    again = event.model_copy(update={"event_id": str(uuid.uuid4())})
    head_id = event.payload.head_id
    first, repeat = logic.epoch_completed(event, _report(1)), logic.epoch_completed(again, _report(1))
    assert first.event_id == repeat.event_id == logic.event_id(head_id, "epoch/1")
    assert logic.epoch_completed(event, _report(0)).event_id != first.event_id
    assert first.payload.epoch.train_loss == 1.5 and first.payload.epoch.steps == 3
    assert logic.epoch_completed(event, _report(0)).payload.epoch.train_loss is None
    assert (first.correlation_id, first.causation_id, first.producer) == (
        head_id,
        event.event_id,
        "head-trainer",
    )
    failure = Failure(ErrorStage.VALIDATION, "x" * 5000)
    assert logic.failed(event, failure).event_id == logic.failed(again, failure).event_id
    assert len(logic.failed(event, failure).payload.message) == logic.MAX_MESSAGE
    other = head_requested(tmp_path, TENANT)
    assert logic.epoch_completed(other, _report(1)).event_id != first.event_id
    # Each start is its own fact.
    starts = {logic.training_started(event, None, "cpu").event_id for _ in range(2)}
    assert len(starts) == 2


@pytest.mark.parametrize(("family", "version"), [("medusa", None), ("eagle", 2), ("eagle3", 3)])
def test_head_trained_is_read_off_the_artifact(tmp_path: Path, family: str, version: int | None) -> None:
    event = head_requested(tmp_path, TENANT)
    head_id = event.payload.head_id
    work = _head_dir(tmp_path / "work", head_id, family=family)
    moved = store.move_to_digest_dir(tmp_path, TENANT, work)
    artifact, config = store.describe(tmp_path, moved)
    trained = logic.trained(event, artifact, config)
    assert trained.event_id == logic.event_id(head_id, "trained")
    assert artifact.eagle_version == version and artifact.num_heads == 3
    assert artifact.params == 12  # the float tensor; draft_ids is an integer buffer
    assert artifact.target_weights == "sha256:abc"
    assert (artifact.sha256, artifact.path) == (moved.name, f"heads/{TENANT}/{moved.name}")
    assert (trained.payload.steps, trained.payload.tokens_seen, trained.payload.stopped_by) == (
        7,
        900,
        "epochs",
    )
    # Built again from the same artifact: the same event.
    assert logic.trained(event, *store.describe(tmp_path, moved)).payload == trained.payload


def test_the_move_is_atomic_and_idempotent(tmp_path: Path) -> None:
    event = head_requested(tmp_path, TENANT)
    head_id = event.payload.head_id
    work = _head_dir(tmp_path / "heads" / TENANT / "work" / head_id, head_id)
    (work / CHECKPOINT).write_bytes(b"x")
    digest = head_digest(work)
    first = store.move_to_digest_dir(tmp_path, TENANT, work)
    assert first.name == digest and not work.exists()
    assert find_head(tmp_path, TENANT, head_id) == first == store.trained_head(tmp_path, TENANT, head_id)
    assert sorted(p.name for p in first.iterdir()) == ["config.json", "head.safetensors"]
    # The same head trained into a work dir again (a redelivery racing a move): nothing changes.
    again = _head_dir(tmp_path / "heads" / TENANT / "work" / head_id, head_id)
    assert store.move_to_digest_dir(tmp_path, TENANT, again) == first and not again.exists()
    assert sorted(p.name for p in (tmp_path / "heads" / TENANT).iterdir()) == [digest, "work"]


def test_a_finished_work_dir_is_moved_without_training_again(tmp_path: Path) -> None:
    head_id = head_requested(tmp_path, TENANT).payload.head_id
    work = _head_dir(tmp_path / "w1", head_id)
    assert store.finished_in(work, head_id)
    assert not store.finished_in(work, "hd-" + "0" * 24)
    (work / CHECKPOINT).write_bytes(b"x")
    assert not store.finished_in(work, head_id)  # unfinished: a checkpoint is left
    assert not store.finished_in(_head_dir(tmp_path / "w2", head_id, stopped_by="budget"), head_id)
    assert store.checkpoint_step(tmp_path / "nowhere") is None


def test_data_paths_stay_in_the_store_and_bad_data_is_refused(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "outside.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    for relative in ("../outside.jsonl", str(tmp_path / "outside.jsonl"), "head-data/acme/none.jsonl"):
        with pytest.raises(SpecError):
            store.data_file(tmp_path / "store", relative)
    good = tmp_path / "store" / "good.jsonl"
    good.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": "d"}\n')
    assert store.data_file(tmp_path / "store", "good.jsonl") == good.resolve()
    assert store.check_examples(good, "good.jsonl") == 2
    bad = tmp_path / "store" / "bad.jsonl"
    for text, match in (
        ("\n", "no examples"),
        ('{"prompt": "a"}\n', "bad.jsonl:1"),
        ("not json\n", "bad.jsonl:1"),
    ):
        bad.write_text(text)
        with pytest.raises(SpecError, match=match) as err:
            store.check_examples(bad, "bad.jsonl")
        assert str(tmp_path) not in str(err.value)
    bad.write_bytes(b"\xff\xfe\n")
    with pytest.raises(SpecError):
        store.check_examples(bad, "bad.jsonl")


def test_the_same_weights_always_give_the_same_file(tmp_path: Path) -> None:
    """weights_sha256 and the digest dir name are sha256s of bytes: saving must be byte-stable
    (safetensors writes its metadata keys in a hash map's order, which changes per call)."""
    from safetensors import safe_open

    from speccore.heads.artifact import HeadConfig, save_head

    config = HeadConfig(family="medusa", hidden_size=8, vocab_size=32, draft_vocab_size=16)
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 8)
    digests = set()
    for n in range(8):
        save_head(tmp_path / str(n), config, module)
        digests.add(store.sha256_of(tmp_path / str(n) / "head.safetensors"))
    assert len(digests) == 1
    with safe_open(str(tmp_path / "0" / "head.safetensors"), framework="pt") as f:
        assert f.metadata() == {"family": "medusa", "format": "specops-head/1"}


def _write_export(out: Path, verifier: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> None:
    """The two files of a speculators export (their content beyond the config is not read here)."""
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights")
    spec = {
        "speculators_version": "0.9.0",
        "speculators_config": {
            "proposal_methods": [{"speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier},
        },
    }
    (out / "config.json").write_text(json.dumps(spec))


def test_an_eagle3_heads_export_moves_with_it_and_is_in_its_artifact(tmp_path: Path) -> None:
    event = head_requested(tmp_path, TENANT, family="eagle3")
    head_id = event.payload.head_id
    work = _head_dir(tmp_path / "heads" / TENANT / "work" / head_id, head_id, family="eagle3")
    digest = head_digest(work)
    store.write_export(work, _write_export)
    assert store.exported(work) and not (work / ".speculators.tmp").exists()
    moved = store.move_to_digest_dir(tmp_path, TENANT, work)
    # The export is derived from the head: the digest is the head's files' alone.
    assert moved.name == digest and find_head(tmp_path, TENANT, head_id) == moved
    assert (moved / "speculators" / "model.safetensors").read_bytes() == b"weights"
    artifact, config = store.describe(tmp_path, moved)
    assert artifact.speculators is not None
    assert artifact.speculators.path == f"heads/{TENANT}/{digest}/speculators"
    assert artifact.speculators.verifier == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (artifact.speculators.speculative_tokens, artifact.speculators.speculators_version) == (3, "0.9.0")
    assert logic.trained(event, artifact, config).payload.artifact.speculators == artifact.speculators


def test_a_head_without_an_export_records_none(tmp_path: Path) -> None:
    head_id = head_requested(tmp_path, TENANT).payload.head_id
    work = _head_dir(tmp_path / "heads" / TENANT / "work" / head_id, head_id)
    # A trainer killed while it wrote the export leaves only its temporary directory.
    _write_export(work / ".speculators.tmp")
    assert not store.exported(work)
    moved = store.move_to_digest_dir(tmp_path, TENANT, work)
    assert sorted(p.name for p in moved.iterdir()) == ["config.json", "head.safetensors"]
    assert store.describe(tmp_path, moved)[0].speculators is None


def test_only_eagle3_heads_of_a_hub_target_are_exported(tmp_path: Path) -> None:
    assert (
        logic.speculators_verifier("eagle3", "smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert logic.speculators_verifier("eagle3", "meta-llama/Llama-3.1-8B-Instruct") == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )
    # A local directory: vLLM elsewhere could not load the verifier it would name.
    assert logic.speculators_verifier("eagle3", str(tmp_path)) is None
    assert logic.speculators_verifier("medusa", "smollm2-135m-instruct") is None
    assert logic.speculators_verifier("eagle", "smollm2-135m-instruct") is None
