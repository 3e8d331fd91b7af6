"""The state directory: what `specops up` started, where it logs, and how to tell if it still runs.

Layout under the state dir::

    runtime.json   servers and service processes (pids, URLs, logs); read by status/down
    runtime.env    the URLs services read (see specplatform.settings)
    lock           serialises concurrent up/down
    nats/          JetStream store of the embedded nats-server
    postgres/      PGDATA of the embedded PostgreSQL (its log is postgres/log)
    logs/          one file per process: nats.log, <service>-<replica>.log, watch.log (the
                   watcher: every restart with its reason)

A recorded pid is trusted only if a process with that pid *and* the recorded start
time exists, so a stale record (crash, reboot, reused pid) reads as "dead" and is
never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specplatform.errors import RuntimeSetupError

STATE_FILE = "runtime.json"
# Start times are read from /proc with 10 ms resolution; allow for rounding.
_START_TIME_TOLERANCE_S = 0.05


class ProcessRef(BaseModel):
    """A process we started: pid plus start time, which together survive pid reuse."""

    model_config = ConfigDict(frozen=True)

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        return cls(pid=pid, create_time=psutil.Process(pid).create_time())

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > _START_TIME_TOLERANCE_S:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


class ServerRecord(BaseModel):
    """NATS or PostgreSQL as the runtime uses it: embedded (``process`` set) or external."""

    name: str
    url: str
    process: ProcessRef | None = Field(None, description="None when the server is external.")
    log: str | None = None
    monitor_url: str | None = None


class ServiceRecord(BaseModel):
    """One replica of one service, started as its own process group."""

    service: str
    replica: int
    process: ProcessRef
    log: str
    argv: list[str]
    env: dict[str, str] = Field(
        default_factory=dict,
        description="What the runtime set in its environment (URLs, seed, ops port): a restart reuses it.",
    )
    metrics_port: int | None = Field(None, description="Its /metrics and /healthz (specplatform.ops).")

    @property
    def name(self) -> str:
        return f"{self.service}[{self.replica}]"


class Restart(BaseModel):
    """One restart by the watcher (or by `up`) of a process that had died."""

    component: str = Field(description="`nats`, `postgres` or `<service>[<replica>]`.")
    at: float = Field(description="Unix time of the restart.")
    reason: str = Field(description="How the old process ended, as far as it is known.")
    pid: int | None = Field(None, description="The new process; None when the restart failed.")
    error: str | None = Field(None, description="Why the restart failed, when it did.")


# runtime.json keeps the latest restarts for `specops status`; watch.log keeps them all.
KEPT_RESTARTS = 20


class RuntimeState(BaseModel):
    servers: dict[str, ServerRecord] = Field(default_factory=dict)
    services: list[ServiceRecord] = Field(default_factory=list)
    watcher: ProcessRef | None = Field(None, description="The watcher process (specops.runtime.watch).")
    restarts: list[Restart] = Field(default_factory=list)

    def add_restart(self, restart: Restart) -> None:
        self.restarts = [*self.restarts, restart][-KEPT_RESTARTS:]


class StateDir:
    """Paths and the state file of one state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def nats_store(self) -> Path:
        return self.root / "nats"

    @property
    def pgdata(self) -> Path:
        return self.root / "postgres"

    def service_log(self, service: str, replica: int) -> Path:
        return self.logs / f"{service}-{replica}.log"

    @property
    def watch_log(self) -> Path:
        return self.logs / "watch.log"

    def ensure(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)

    def load(self) -> RuntimeState:
        try:
            text = self.state_file.read_text()
        except FileNotFoundError:
            return RuntimeState()
        try:
            return RuntimeState.model_validate_json(text)
        except ValidationError:
            # Guessing here could start a second nats-server on the same store.
            raise RuntimeSetupError(
                f"{self.state_file} is unreadable; stop any nats-server/postgres/specops processes "
                "using this state dir, then delete the file"
            ) from None

    def save(self, state: RuntimeState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.model_dump_json(indent=2))
        os.replace(tmp, self.state_file)

    def write_atomic(self, path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive for the duration of an up/down; waits for a concurrent one to finish."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def terminate(ref: ProcessRef, *, group: bool, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> bool:
    """Send `sig`, wait, then SIGKILL; True if it had to be killed. A dead ref is a no-op."""
    if not ref.alive():
        return False
    _signal(ref, sig, group)
    if _wait_dead(ref, timeout_s):
        return False
    _signal(ref, signal.SIGKILL, group)
    _wait_dead(ref, 5.0)
    return True


def _signal(ref: ProcessRef, sig: int, group: bool) -> None:
    # Services run in their own session, so the group also holds engines they spawned.
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(ref.pid, sig)
        else:
            os.kill(ref.pid, sig)


def _wait_dead(ref: ProcessRef, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not ref.alive():
            return True
        _reap(ref.pid)
        time.sleep(0.05)
    return not ref.alive()


def _reap(pid: int) -> None:
    # When the caller is also the parent (tests, one `up` process), collect the zombie.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
