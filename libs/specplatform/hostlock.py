"""One measuring process per device per host: an `flock` on a file named after the device.

A speedup is a ratio of two timings taken on one machine; anything else computing on
the same cores (or the same GPU) while they are taken skews it, and a skewed speedup is
cached as a winner for 30 days. The benchmark-runner's replicas, and the quality gate
that runs the same model, therefore hold the device's lock for exactly as long as they
compute on it. `flock` is per host (not per process like a threading.Lock, not per state
dir, since two state dirs on one host still share its hardware) and the kernel releases
it when its holder dies, so a killed replica never leaves a stale lock behind.

Each span a lock was held is appended to a journal next to the lock file, written while
the lock is still held (so the journal's lines never interleave): who held the device,
for what, from when to when. That is how an operator, or a test, sees that measurements
on a host never overlapped.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

log = logging.getLogger(__name__)

LOCK_DIR_ENV = "SPECOPS_MEASURE_LOCK_DIR"
# How often a waiter retries; the lock is held for seconds to minutes at a time.
POLL_S = 0.05


def default_lock_dir() -> Path:
    """`/tmp/specops-<uid>/locks`: one per user and host (set SPECOPS_MEASURE_LOCK_DIR to a
    directory every user can write to if several users measure on one host)."""
    return Path(tempfile.gettempdir()) / f"specops-{os.getuid()}" / "locks"


# The setting of every service that measures or gates (SPECOPS_MEASURE_LOCK_DIR).
MeasureLockDir = Annotated[
    Path,
    Field(
        default_factory=default_lock_dir,
        description="Where the host-wide lock files of the measuring devices are; every process that "
        "measures or gates on this host must use the same directory.",
    ),
]


class LockAbandoned(Exception):
    """The waiter was told to stop before the lock was free."""


@dataclass(frozen=True, slots=True)
class HeldSpan:
    """One span a device lock was held, as its journal records it."""

    device: str  # the lock's name: "cpu", or "cuda-<GPU uuid>"
    purpose: str  # what was computed, e.g. "bench <bench id>"
    host: str
    pid: int
    service: str  # SPECOPS_SERVICE of the holder ("" when run by hand)
    replica: int  # SPECOPS_REPLICA of the holder
    started_at: float  # wall clock (time.time()) when the lock was acquired
    ended_at: float  # wall clock just before it was released
    waited_s: float  # how long the holder waited for it

    def overlaps(self, other: HeldSpan) -> bool:
        return self.started_at < other.ended_at and other.started_at < self.ended_at


def device_lock_name(device: str) -> str:
    """The lock a model on `device` (auto, cpu, cuda, cuda:N) holds: `cpu` or `cuda-<uuid>`.

    A GPU is named by its UUID, not its index: two processes pinned to different GPUs by
    CUDA_VISIBLE_DEVICES both call theirs `cuda:0`.
    """
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        return "cpu"  # not a device: loading the model fails and says so; nothing runs here
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"cuda-{uuid}" if uuid is not None else f"cuda{index}"


class DeviceLock:
    """The host-wide lock of one device, in `directory` (created if missing)."""

    def __init__(self, directory: Path, device: str) -> None:
        self.directory = directory
        self.device = device
        self.path = directory / f"{device}.lock"
        self.journal = directory / f"{device}.spans.jsonl"

    @contextmanager
    def held(self, purpose: str, stop: threading.Event | None = None) -> Iterator[None]:
        """Hold the lock for the body; blocks the calling thread until it is free.

        Call it from a worker thread, never on an event loop. `stop` set while waiting
        raises LockAbandoned (a shutting-down service does not wait out another's bench).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            waited = self._acquire(fd, purpose, stop)
            start = time.time()
            _write_holder(fd, purpose)
            try:
                yield
            finally:
                span = HeldSpan(self.device, purpose, *_identity(), start, time.time(), waited)
                with open(self.journal, "a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(span)) + "\n")
        finally:
            os.close(fd)  # releases the flock

    def _acquire(self, fd: int, purpose: str, stop: threading.Event | None) -> float:
        began = time.monotonic()
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if not announced:
                log.info("%s waits for the %s lock, held by %s", purpose, self.device, _read_holder(fd))
                announced = True
            if stop is None:
                time.sleep(POLL_S)
            elif stop.wait(POLL_S):
                raise LockAbandoned(f"{purpose}: stopped while waiting for the {self.device} lock")
        waited = time.monotonic() - began
        if announced:
            log.info("%s took the %s lock after %.1f s", purpose, self.device, waited)
        return waited

    def spans(self) -> list[HeldSpan]:
        """Every span the journal records, oldest first."""
        if not self.journal.is_file():
            return []
        lines = self.journal.read_text(encoding="utf-8").splitlines()
        return [HeldSpan(**json.loads(line)) for line in lines if line.strip()]


def _identity() -> tuple[str, int, str, int]:
    return (
        socket.gethostname(),
        os.getpid(),
        os.environ.get("SPECOPS_SERVICE", ""),
        int(os.environ.get("SPECOPS_REPLICA", "0") or 0),
    )


def _write_holder(fd: int, purpose: str) -> None:
    host, pid, service, replica = _identity()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{service}[{replica}] pid {pid} on {host}: {purpose}".encode(), 0)


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace") or "another process"
    except OSError:
        return "another process"
