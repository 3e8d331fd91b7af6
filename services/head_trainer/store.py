"""The head-trainer's files in the artifact store (speccatalog.artifacts' layout): the
request's data, the work dir a head trains in (with its checkpoint and, for an EAGLE-3 head,
its speculators export), and the move of a trained head to its digest directory. Blocking;
called in worker threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from speccatalog.artifacts import (
    HEAD_FILES,
    HEAD_SPECULATORS_DIR,
    find_head,
    head_artifact_path,
    head_digest,
    head_work_dir,
)
from speccore.errors import SpecError
from speccore.heads.artifact import CONFIG_FILE, WEIGHTS_FILE
from speccore.heads.speculators import SPECULATORS_FILES
from speccore.training.data import read_examples
from speccore.training.trainer import CHECKPOINT
from specops_schemas.heads import HeadArtifact
from specops_services.head_trainer import logic

# safetensors dtypes of trainable weights (the draft vocabulary's ids are an integer buffer).
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def data_file(root: Path, relative: str) -> Path:
    """A data path of `head.requested` (relative to the store), checked; SpecError if unusable."""
    path = (root / relative).resolve()
    if Path(relative).is_absolute() or not path.is_relative_to(root.resolve()):
        raise SpecError(f"data path {relative!r} is outside the artifact store")
    if not path.is_file():
        raise SpecError(f"data file {relative!r} is not in the artifact store")
    return path


def check_examples(path: Path, relative: str) -> int:
    """How many examples the JSONL holds; SpecError for a bad line or none at all."""
    try:
        count = sum(1 for _ in read_examples(path))
    except UnicodeDecodeError as err:
        raise SpecError(f"{relative}: not UTF-8 text ({err})") from None
    except SpecError as err:
        raise SpecError(str(err).replace(str(path), relative)) from None
    if count == 0:
        raise SpecError(f"{relative}: no examples")
    return count


def work_dir(root: Path, tenant_id: str, head_id: str) -> Path:
    return root / head_work_dir(tenant_id, head_id)


def checkpoint_step(work: Path) -> int | None:
    """The step of the checkpoint a restarted training resumes from; None: it starts fresh."""
    path = work / CHECKPOINT
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, weights_only=False, map_location="cpu")
        return int(payload["state"]["steps"])
    except Exception:  # noqa: BLE001 - train_head says what is wrong with it
        return None


def finished_in(work: Path, head_id: str) -> bool:
    """Whether `work` holds the whole trained head (killed before it was moved): no need to train."""
    if (work / CHECKPOINT).exists() or not all((work / name).is_file() for name in HEAD_FILES):
        return False
    try:
        provenance = json.loads((work / CONFIG_FILE).read_text()).get("provenance") or {}
    except (OSError, ValueError):
        return False
    return provenance.get("head_id") == head_id and provenance.get("stopped_by") == "epochs"


def move_to_digest_dir(root: Path, tenant_id: str, work: Path) -> Path:
    """Copy the head's files into `heads/<tenant>/<digest>/` (a rename of a complete temp dir,
    so no reader sees half of it), then remove the work dir. Idempotent: a digest dir that
    exists already is the same bytes."""
    digest = head_digest(work)
    dest = root / head_artifact_path(tenant_id, digest)
    if not dest.is_dir():
        tmp = dest.parent / f".{digest}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.mkdir(parents=True)
        try:
            names = list(HEAD_FILES)
            if (work / HEAD_SPECULATORS_DIR).is_dir():
                (tmp / HEAD_SPECULATORS_DIR).mkdir()
                os.chmod(tmp / HEAD_SPECULATORS_DIR, 0o755)
                names += [f"{HEAD_SPECULATORS_DIR}/{name}" for name in SPECULATORS_FILES]
            for name in names:
                shutil.copyfile(work / name, tmp / name)
                with open(tmp / name, "rb") as fp:
                    os.fsync(fp.fileno())
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, dest)
            except OSError:
                if not dest.is_dir():  # another process moved it meanwhile: the same bytes
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return dest


def trained_head(root: Path, tenant_id: str, head_id: str) -> Path | None:
    """The head's digest dir if it was trained already (a redelivered request)."""
    return find_head(root, tenant_id, head_id)


def exported(work: Path) -> bool:
    """Whether `work` holds the speculators export (:func:`write_export` renames it in whole)."""
    return all((work / HEAD_SPECULATORS_DIR / name).is_file() for name in SPECULATORS_FILES)


def write_export(work: Path, write: Callable[[Path], object]) -> None:
    """Write the head's speculators export with `write(directory)` into a temporary directory,
    then rename it to `work/speculators`: a trainer killed meanwhile leaves no half of it."""
    tmp = work / f".{HEAD_SPECULATORS_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    os.rename(tmp, work / HEAD_SPECULATORS_DIR)


def describe(root: Path, directory: Path) -> tuple[HeadArtifact, dict[str, Any]]:
    """The artifact of a head's digest dir (with its speculators export, if any), and its config.json."""
    config = json.loads((directory / CONFIG_FILE).read_text())
    speculators = None
    if exported(directory):
        export = directory / HEAD_SPECULATORS_DIR
        speculators = logic.speculators_export(
            export.relative_to(root).as_posix(), json.loads((export / CONFIG_FILE).read_text())
        )
    artifact = logic.head_artifact(
        digest=directory.name,
        path=directory.relative_to(root).as_posix(),
        weights_sha256=sha256_of(directory / WEIGHTS_FILE),
        config=config,
        params=trainable_params(directory / WEIGHTS_FILE),
        speculators=speculators,
    )
    return artifact, config


def trainable_params(weights: Path) -> int:
    """Floating-point numbers in `head.safetensors`: the head's trained parameters."""
    total = 0
    with safe_open(str(weights), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            tensor = f.get_slice(key)
            if tensor.get_dtype() in _FLOAT_DTYPES:
                numel = 1
                for dim in tensor.get_shape():
                    numel *= int(dim)
                total += numel
    return max(total, 1)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
