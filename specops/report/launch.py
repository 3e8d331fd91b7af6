"""One `specops serve engine` process per method, started once for the whole report and
stopped (SIGTERM) at its end; its log goes to a file beside the results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from speccore.errors import SpecError
from specops.runtime.ports import free_port

START_S = 300.0


@contextmanager
def engine_servers(
    methods: dict[str, list[str]], model: str, common: list[str], log_dir: Path
) -> Iterator[dict[str, str]]:
    """{method label: base URL} of a healthy server per method, all stopped on exit."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        urls = {
            label: stack.enter_context(
                engine_server(["--model", model, *flags, *common], log_dir / f"{label}.log")
            )
            for label, flags in methods.items()
        }
        yield urls


@contextmanager
def engine_server(args: list[str], log: Path) -> Iterator[str]:
    """The base URL of a healthy `specops serve engine ARGS` on a free port, stopped on exit."""
    port = free_port()
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    cmd = [sys.executable, "-m", "specops.cli", "serve", "engine", *args, "--port", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecError(f"the engine server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SpecError(f"the engine server was not healthy within {START_S:.0f} s; see {log}")
