"""Service replicas as OS processes: spawning one (its environment, log and ops port),
bringing the recorded set to the requested counts, and starting a dead one again."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from specops.runtime.state import ProcessRef, RuntimeState, ServiceRecord, StateDir, terminate
from specplatform.errors import RuntimeSetupError
from specplatform.settings import STATE_DIR_ENV

Progress = Callable[[str], None]
METRICS_PORT_ENV = "SPECOPS_METRICS_PORT"
# The host of every replica's ops endpoints (specplatform.ops' default).
OPS_HOST = "127.0.0.1"


def free_port(host: str = OPS_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def reconcile(
    state: RuntimeState,
    state_dir: StateDir,
    counts: Mapping[str, int],
    services: Sequence[str],
    command: Callable[[str], list[str]],
    service_env: Callable[[str], Mapping[str, str]],
    progress: Progress,
) -> list[ServiceRecord]:
    """Keep the live replicas below each count, stop those above, start the missing ones;
    returns those started. `state.services` is updated."""
    unknown = sorted(set(counts) - set(services))
    if unknown:
        raise RuntimeSetupError(f"unknown services: {', '.join(unknown)}; services: {', '.join(services)}")
    keep: list[ServiceRecord] = []
    for record in state.services:
        if not record.process.alive():
            continue  # stale: its slot is refilled below
        wanted = counts.get(record.service)
        if wanted is not None and record.replica >= wanted:
            progress(f"{record.name}: stopping (above {wanted} replicas)")
            terminate(record.process, group=True)
            continue
        keep.append(record)
    running = {(r.service, r.replica) for r in keep}
    started: list[ServiceRecord] = []
    for service in services:
        for replica in range(counts.get(service, 0)):
            if (service, replica) in running:
                progress(f"{service}[{replica}]: already running")
                continue
            env = dict(service_env(service)) | {METRICS_PORT_ENV: str(free_port())}
            record, _ = spawn(state_dir, service=service, replica=replica, argv=command(service), env=env)
            progress(f"{record.name}: started (pid {record.process.pid}, log {record.log})")
            started.append(record)
    state.services = keep + started
    return started


def respawn(state_dir: StateDir, record: ServiceRecord) -> tuple[ServiceRecord, subprocess.Popen[bytes]]:
    """Start the dead replica of `record` again with the same command and environment; its
    ops port too, unless another process took it meanwhile."""
    env = dict(record.env)
    if record.metrics_port is not None and not _port_free(record.metrics_port):
        env[METRICS_PORT_ENV] = str(free_port())
    return spawn(state_dir, service=record.service, replica=record.replica, argv=record.argv, env=env)


def spawn(
    state_dir: StateDir, *, service: str, replica: int, argv: list[str], env: Mapping[str, str]
) -> tuple[ServiceRecord, subprocess.Popen[bytes]]:
    """One replica in its own session, logging to its file; `env` is what the runtime sets
    over this process's own environment (recorded, so that a restart sets it again)."""
    full = dict(os.environ)
    full.update(env)
    full[STATE_DIR_ENV] = str(state_dir.root)
    full["SPECOPS_SERVICE"] = service
    full["SPECOPS_REPLICA"] = str(replica)
    # Several model-running processes share few cores: spinning OpenMP threads in one
    # starve the others (a 5x slowdown was measured on the 2-core hosts).
    full.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    log = state_dir.service_log(service, replica)
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} start: {' '.join(argv)}\n".encode())
        out.flush()
        # Own session: the group is signalled as a whole on down, and Ctrl-C on the
        # terminal that ran `specops up` does not reach the services.
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full,
            start_new_session=True,
        )
    port = env.get(METRICS_PORT_ENV)
    record = ServiceRecord(
        service=service,
        replica=replica,
        process=ProcessRef.of(proc.pid),
        log=str(log),
        argv=argv,
        env=dict(env),
        metrics_port=int(port) if port else None,
    )
    return record, proc


def check_started(started: Sequence[ServiceRecord], grace_s: float) -> None:
    """RuntimeSetupError naming the replicas of `started` that died within `grace_s`."""
    if not started:
        return
    time.sleep(grace_s)
    dead = [r for r in started if not r.process.alive()]
    if dead:
        first = dead[0]
        names = ", ".join(r.name for r in dead)
        raise RuntimeSetupError(
            f"{names} exited right after starting: {last_line(Path(first.log))} (log {first.log}); "
            "the servers and any other services keep running until `specops down`"
        )


def last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((OPS_HOST, port))
        except OSError:
            return False
        return True
