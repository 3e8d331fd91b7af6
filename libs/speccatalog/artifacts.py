"""Tenant artifacts in the content-addressed store (a directory, ``SPECOPS_ARTIFACT_DIR``):
where an uploaded REST corpus lives and how its datastore id derives; where T3 training
data and trained heads live and how a head is found from its id.

Layout: ``datastores/<tenant>/<sha256>.<txt|jsonl>``, the file's own sha256 as its name.
The id, ``ds-<hex>``, is derived from (tenant, sha256): the same bytes uploaded twice by
one tenant are one datastore, by two tenants two (F-S1: a tenant's drafts are its own).
Whoever measures a candidate finds the corpus from the id and the run's tenant alone
(:func:`find_corpus`), in that tenant's directory only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from pathlib import Path

DATASTORES_DIR = "datastores"
DATASTORE_PREFIX = "ds-"
CORPUS_SUFFIXES = {"text": ".txt", "jsonl": ".jsonl"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def datastore_id(tenant_id: str, sha256: str) -> str:
    """The id of a tenant's corpus: subject-safe, a rest candidate's ``draft``."""
    return DATASTORE_PREFIX + hashlib.sha256(f"{tenant_id}/{sha256}".encode()).hexdigest()[:24]


def is_datastore_id(ref: str | None) -> bool:
    return bool(ref) and str(ref).startswith(DATASTORE_PREFIX)


def corpus_path(tenant_id: str, sha256: str, fmt: str) -> str:
    """A corpus's path relative to the artifact store."""
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{DATASTORES_DIR}/{tenant_id}/{sha256}{CORPUS_SUFFIXES[fmt]}"


def find_corpus(root: Path, tenant_id: str, ref: str) -> Path | None:
    """The corpus file of datastore ``ref`` among ``tenant_id``'s, or None if it has none."""
    directory = root / DATASTORES_DIR / tenant_id
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        if (
            path.suffix in CORPUS_SUFFIXES.values()
            and _SHA256.fullmatch(path.stem)
            and datastore_id(tenant_id, path.stem) == ref
        ):
            return path
    return None


# --- T3 heads -----------------------------------------------------------------------------------
# Layout: ``head-data/<tenant>/<sha256>.jsonl`` (training and held-out uploads),
# ``heads/<tenant>/<digest>/{config.json,head.safetensors}`` (trained heads, by the digest of
# both files; config.json's ``provenance.head_id`` names the head), and
# ``heads/<tenant>/work/<head_id>/`` (a head in training, with its checkpoint). An EAGLE-3
# head's digest dir also holds ``speculators/``: the head exported for vLLM, derived from
# the two files and the target's embeddings, so the digest leaves it out.
HEAD_DATA_DIR = "head-data"
HEADS_DIR = "heads"
HEAD_WORK_DIR = "work"
HEAD_PREFIX = "hd-"
HEAD_FILES = ("config.json", "head.safetensors")
HEAD_SPECULATORS_DIR = "speculators"
_HEAD_ID = re.compile(r"hd-[0-9a-f]{24}")


def new_head_id() -> str:
    """A fresh head id: subject-safe, a head candidate's ``draft``."""
    return HEAD_PREFIX + secrets.token_hex(12)


def is_head_id(ref: str | None) -> bool:
    return bool(ref) and _HEAD_ID.fullmatch(str(ref)) is not None


def head_data_path(tenant_id: str, sha256: str) -> str:
    """An uploaded training or held-out JSONL's path relative to the artifact store."""
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{HEAD_DATA_DIR}/{tenant_id}/{sha256}.jsonl"


def head_work_dir(tenant_id: str, head_id: str) -> str:
    """Where a head trains (and keeps its checkpoint), relative to the store."""
    if not is_head_id(head_id):
        raise ValueError(f"not a head id: {head_id!r}")
    return f"{HEADS_DIR}/{tenant_id}/{HEAD_WORK_DIR}/{head_id}"


def head_artifact_path(tenant_id: str, digest: str) -> str:
    """A trained head's directory relative to the store, by its digest (:func:`head_digest`)."""
    if not _SHA256.fullmatch(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return f"{HEADS_DIR}/{tenant_id}/{digest}"


def head_digest(directory: Path) -> str:
    """The content address of a head directory: sha256 over its files' names and bytes."""
    h = hashlib.sha256()
    for name in HEAD_FILES:
        data = (directory / name).read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def find_head(root: Path, tenant_id: str, head_id: str) -> Path | None:
    """The trained head directory of ``head_id`` among ``tenant_id``'s, or None if it has none.

    Only a directory whose name is its digest counts, so a half-moved or altered artifact
    is never loaded."""
    directory = root / HEADS_DIR / tenant_id
    if not is_head_id(head_id) or not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        config = path / "config.json"
        if not (_SHA256.fullmatch(path.name) and config.is_file()):
            continue
        try:
            provenance = json.loads(config.read_text()).get("provenance") or {}
        except (OSError, ValueError):
            continue
        if provenance.get("head_id") == head_id and head_digest(path) == path.name:
            return path
    return None
