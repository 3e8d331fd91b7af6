"""Tenant artifacts in the content-addressed store (a directory, ``SPECOPS_ARTIFACT_DIR``):
where an uploaded REST corpus lives and how its datastore id derives.

Layout: ``datastores/<tenant>/<sha256>.<txt|jsonl>``, the file's own sha256 as its name.
The id, ``ds-<hex>``, is derived from (tenant, sha256): the same bytes uploaded twice by
one tenant are one datastore, by two tenants two (F-S1: a tenant's drafts are its own).
Whoever measures a candidate finds the corpus from the id and the run's tenant alone
(:func:`find_corpus`), in that tenant's directory only.
"""

from __future__ import annotations

import hashlib
import re
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
