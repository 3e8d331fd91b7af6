"""Where derived files live, and writing them so that readers never see half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """Where specops keeps derived files; ``SPECOPS_CACHE_DIR`` overrides it."""
    return Path(os.environ.get("SPECOPS_CACHE_DIR") or platformdirs.user_cache_dir("specops"))


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` (mode 0644)
    when the block ends, removed if it raises — a kill mid-write leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; these files are shared artifacts
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
