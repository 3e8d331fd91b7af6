"""A request body streamed to disk under a size limit: datastore uploads and head training data."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path

from fastapi import Request
from starlette.requests import ClientDisconnect

from specops_services.gateway.http.problems import ProblemError, problem

READ_CHUNK = 1 << 20


async def receive(request: Request, directory: Path, max_bytes: int) -> tuple[Path, str, int]:
    """The body streamed to a temporary file in `directory`, with its sha256 and size."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".upload-")
    tmp = Path(name)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(max_bytes)
                digest.update(chunk)
                f.write(chunk)
    except ClientDisconnect:
        # The body limit (specplatform.body_limit.BodyLimit) cut the body off; it answers the 413 itself.
        tmp.unlink(missing_ok=True)
        raise too_large(max_bytes) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, digest.hexdigest(), size


def too_large(max_bytes: int) -> ProblemError:
    return problem(
        413,
        f"the corpus is over {max_bytes} bytes, this gateway's limit (SPECOPS_DATASTORE_MAX_BYTES)",
        type="urn:specops:problem:body-too-large",
    )


def settle(tmp: Path, final: Path) -> None:
    """Move the checked upload to its content address (kept as it is if it is there already)."""
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, final)
