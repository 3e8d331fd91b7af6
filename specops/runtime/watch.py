"""The watcher: keeps every process `specops up` started alive until `specops down`.

`up` starts it as a detached process (`python -m specops.runtime.watch STATE_DIR`) and
records it in the state; `down` stops it first, so that nothing it is stopping is started
again. Every `POLL_S` it takes the state dir's lock, restarts a dead embedded nats-server
or PostgreSQL at its recorded address (specops.runtime.servers) and a dead service
replica with its recorded command and environment (specops.runtime.replicas), with
capped backoff (specops.runtime.backoff), and logs each restart with how the old
process ended to <state>/logs/watch.log. One watcher per state dir: a watcher that is
not the one recorded (a newer `up` replaced it, `down` removed it) exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from specops.runtime.backoff import Backoff, RestartPolicy
from specops.runtime.replicas import last_line, respawn
from specops.runtime.servers import restart_server
from specops.runtime.state import ProcessRef, Restart, RuntimeState, StateDir, terminate
from specplatform.errors import RuntimeSetupError

log = logging.getLogger("specops.watch")

POLL_S = 0.5
ProgressFn = Callable[[str], None]


def ensure_watcher(state: RuntimeState, state_dir: StateDir, progress: ProgressFn) -> None:
    """Start the watcher unless the recorded one runs; `state.watcher` is set (the caller
    saves the state, under the lock, before the watcher's first pass can read it)."""
    if state.watcher is not None and state.watcher.alive():
        progress(f"watcher: already running (pid {state.watcher.pid})")
        return
    state_dir.ensure()
    with open(state_dir.watch_log, "ab") as out:
        # Own session: it outlives the `up` that started it and the terminal it ran in.
        proc = subprocess.Popen(
            [sys.executable, "-m", "specops.runtime.watch", str(state_dir.root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    state.watcher = ProcessRef.of(proc.pid)
    progress(f"watcher: started (pid {proc.pid}, log {state_dir.watch_log})")


def stop_watcher(state: RuntimeState, progress: ProgressFn) -> None:
    """Stop the recorded watcher. Called under the lock, so it is between passes (or waiting
    for the lock), never half-way through a restart."""
    if state.watcher is not None and state.watcher.alive():
        progress("watcher: stopping")
        terminate(state.watcher, group=False, timeout_s=5.0)
    state.watcher = None


class Watcher:
    """One watcher process's passes over the state dir."""

    def __init__(self, state_dir: StateDir, policy: RestartPolicy | None = None) -> None:
        self.state_dir = state_dir
        self.backoff = Backoff(policy or RestartPolicy())
        # The replicas this watcher started: it is their parent, so it learns their exit
        # status (and must reap them); the others' ended before it could know how.
        self.children: dict[int, subprocess.Popen[bytes]] = {}

    def pass_once(self, now: float) -> bool:
        """Restart what is due; False when this process is no longer the recorded watcher."""
        with self.state_dir.locked():
            state = self.state_dir.load()
            if state.watcher is None or state.watcher.pid != os.getpid():
                return False
            changed = self._servers(state, now)
            changed = self._services(state, now) or changed
            if changed:
                self.state_dir.save(state)
        self._reap()
        return True

    def _servers(self, state: RuntimeState, now: float) -> bool:
        changed = False
        for name in ("nats", "postgres"):
            record = state.servers.get(name)
            if record is None or record.process is None or record.process.alive():
                continue
            if not self.backoff.due(name, uptime_s=now - record.process.create_time, now=now):
                continue
            reason = _reason(record.process.pid, self.children, Path(record.log) if record.log else None)
            try:
                new = restart_server(self.state_dir, record)
            except (RuntimeSetupError, OSError) as exc:
                delay = self.backoff.failed(name, now=now)
                log.error("%s died (%s); restart failed: %s; next try in %.0fs", name, reason, exc, delay)
                state.add_restart(Restart(component=name, at=time.time(), reason=reason, error=str(exc)))
                changed = True
                continue
            self.backoff.started(name)
            state.servers[name] = new
            pid = new.process.pid if new.process is not None else None
            old = record.process.pid
            log.warning("restarted %s at %s (pid %s -> %s): %s", name, new.url, old, pid, reason)
            state.add_restart(Restart(component=name, at=time.time(), reason=reason, pid=pid))
            changed = True
        return changed

    def _services(self, state: RuntimeState, now: float) -> bool:
        changed = False
        for index, record in enumerate(state.services):
            if record.process.alive():
                continue
            name = record.name
            if not self.backoff.due(name, uptime_s=now - record.process.create_time, now=now):
                continue
            reason = _reason(record.process.pid, self.children, Path(record.log))
            try:
                new, proc = respawn(self.state_dir, record)
            except OSError as exc:
                delay = self.backoff.failed(name, now=now)
                log.error("%s died (%s); restart failed: %s; next try in %.0fs", name, reason, exc, delay)
                state.add_restart(Restart(component=name, at=time.time(), reason=reason, error=str(exc)))
                changed = True
                continue
            self.backoff.started(name)
            self.children[proc.pid] = proc
            state.services[index] = new
            log.warning("restarted %s (pid %d -> %d): %s", name, record.process.pid, proc.pid, reason)
            state.add_restart(Restart(component=name, at=time.time(), reason=reason, pid=proc.pid))
            changed = True
        return changed

    def _reap(self) -> None:
        for proc in self.children.values():
            proc.poll()


def _reason(pid: int, children: dict[int, subprocess.Popen[bytes]], log_file: Path | None) -> str:
    """How process `pid` ended: its exit status when it was our child (a replica or a
    nats-server this watcher started), and its last log line."""
    proc = children.pop(pid, None)
    code = proc.wait() if proc is not None else _exit_code(pid)
    if code is None:
        how = "found dead (exit status unknown: not started by this watcher)"
    elif code < 0:
        how = f"killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with status {code}"
    return how + (f"; last log line: {last_line(log_file)}" if log_file is not None else "")


def _exit_code(pid: int) -> int | None:
    # Reaps a child that is no Popen of ours (nats-server started by restart_server).
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if reaped == pid else None


def run(state_dir: StateDir, *, poll_s: float = POLL_S) -> None:
    """Pass until this process is no longer the recorded watcher (or is signalled)."""
    watcher = Watcher(state_dir)
    log.info("watching %s (pid %d)", state_dir.root, os.getpid())
    while watcher.pass_once(time.time()):
        time.sleep(poll_s)
    log.info("no longer the recorded watcher of %s: exiting", state_dir.root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specops.runtime.watch", description=__doc__)
    parser.add_argument("state_dir", type=Path, help="the state dir of the runtime to keep alive")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s watch %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    run(StateDir(args.state_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
