"""Head-training requests for the head-trainer's tests: a small JSONL in the artifact store,
and the `head.requested` the gateway would publish for it. Import as
``from heads_data import head_requested``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from specbus.envelope import Envelope, new_event
from speccatalog.artifacts import head_data_path, new_head_id
from specops_schemas.heads import HeadRequested, HeadTrainRequest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "artifacts" / "heads" / "smollm2-135m-instruct" / "data" / "train.jsonl"
MODEL = "smollm2-135m-instruct"


def store_data(root: Path, tenant: str, lines: int = 40, *, text: bytes | None = None) -> tuple[str, str]:
    """Put `lines` examples of the smollm2 training set (or `text`) into `head-data/<tenant>/`;
    (sha256, path relative to the store)."""
    data = text if text is not None else b"".join(TRAIN.read_bytes().splitlines(keepends=True)[:lines])
    sha = hashlib.sha256(data).hexdigest()
    relative = head_data_path(tenant, sha)
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).write_bytes(data)
    return sha, relative


def head_requested(
    root: Path,
    tenant: str,
    *,
    lines: int = 40,
    text: bytes | None = None,
    heldout: bytes | None = None,
    **request: Any,
) -> Envelope[HeadRequested]:
    """A `head.requested` of a small medusa head (max_len 128, draft_vocab 2048, 2 epochs) on
    the first `lines` examples of the smollm2 set (or `text`), held out: `heldout` or the split."""
    sha, relative = store_data(root, tenant, lines, text=text)
    heldout_sha = heldout_path = None
    if heldout is not None:
        heldout_sha, heldout_path = store_data(root, tenant, text=heldout)
    fields: dict[str, Any] = {
        "target": MODEL,
        "family": "medusa",
        "train_data": sha,
        "epochs": 2,
        "max_len": 128,
        "draft_vocab": 2048,
        "heldout_data": heldout_sha,
    }
    body = HeadTrainRequest(**(fields | request))
    head_id = new_head_id()
    payload = HeadRequested(
        head_id=head_id, request=body, train_path=relative, heldout_path=heldout_path, requested_by="tok-test"
    )
    return new_event(payload, tenant_id=tenant, correlation_id=head_id, producer="gateway")
