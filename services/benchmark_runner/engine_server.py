"""An OpenAI-compatible engine server for one bench method: launched, or attached to.

A bench measures each method (the baseline and every candidate) on a server
of its own, started once per bench with the candidate's flags (:func:`launch_command`:
the flags ``specops apply`` answers, ``specops_schemas.engine_flags``) on a free port
and stopped when the bench ends, fails or is cancelled (:class:`EngineServer`: its own
process group, SIGTERM then SIGKILL; and SIGTERM from the kernel when the runner
itself dies, DIE_WITH_PARENT). A method with a URL in the settings is measured
on that server instead, which is then left running.

Command lines (the executable part is a setting, shlex-split):

- vLLM: ``vllm serve <model> --host H --port P [--speculative-config JSON]``
- SGLang: ``python -m sglang.launch_server --model-path <model> --host H --port P [--speculative-*]``
- speccore: ``specops serve engine --model <model> --host H --port P --method M [--k K ...]``
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

import httpx

from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine
from specops_schemas.engine_flags import engine_config

HOST = "127.0.0.1"
# The launched command runs under this: on Linux it asks the kernel to SIGTERM it when the
# thread that started it dies (a runner killed with SIGKILL leaves no server behind), then
# execs the command. Done in a fresh single-threaded process, not in preexec_fn, which is
# unsafe in a process with threads. PR_SET_PDEATHSIG = 1; it survives the exec.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the runner that started this engine server is gone')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
LOG_TAIL_CHARS = 3000
STOP_GRACE_S = 20.0
POLL_S = 0.5


class HttpEngine(StrEnum):
    """The engines the runner drives over HTTP, and the prefix of their Prometheus names."""

    VLLM = "vllm"
    SGLANG = "sglang"
    SPECOPS = "specops"  # `specops serve engine`: speccore behind the OpenAI API

    @property
    def metrics_prefix(self) -> str:
        return f"{self.value}:"

    @property
    def catalog_engine(self) -> Engine:
        """The engine whose flags render a candidate for this server."""
        return {"vllm": Engine.VLLM, "sglang": Engine.SGLANG, "specops": Engine.SPECCORE}[self.value]


class EngineStartError(RuntimeError):
    """The server could not be started or never answered /health; the message says why."""


def launch_command(
    engine: HttpEngine,
    executable: Sequence[str],
    model: str,
    candidate: Candidate | None,
    *,
    port: int,
    draft_paths: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line serving ``model`` with ``candidate``'s speculation (None: the baseline).

    EngineCannotRun when the engine cannot run the candidate (the catalog's refusal).
    """
    flags = launch_args(engine, candidate, draft_paths=draft_paths, extra_args=extra_args)
    return [*server_command(engine, executable, model, port), *flags]


def server_command(engine: HttpEngine, executable: Sequence[str], model: str, port: int) -> list[str]:
    """The command up to the flags: the launcher, the model, and the address."""
    where = ["--host", HOST, "--port", str(port)]
    if engine == HttpEngine.VLLM:
        return [*executable, "serve", model, *where]
    if engine == HttpEngine.SGLANG:
        return [*executable, "--model-path", model, *where]
    return [*executable, "serve", "engine", "--model", model, *where]


def launch_args(
    engine: HttpEngine,
    candidate: Candidate | None,
    *,
    draft_paths: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The flags after the model and address: the candidate's, exactly as ``apply`` renders
    them (``engine_config``; none for vLLM's and SGLang's baseline), then the server settings."""
    flags: list[str] = []
    if candidate is not None:
        _, flags = engine_config(candidate, engine.catalog_engine, draft_paths=draft_paths)
    if engine == HttpEngine.SPECOPS:
        flags = flags or ["--method", "none"]
    return [*flags, *extra_args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to reach, and if need be start, one method's server."""

    engine: HttpEngine
    command: Sequence[str] | None  # None: attach to `url`
    url: str
    start_timeout_s: float
    env: Mapping[str, str] | None = None
    log: Path | None = None  # where its output goes (appended, kept); None: a temporary file


class EngineServer:
    """One running engine server: started (or attached to) on enter, stopped on exit."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.url = spec.url.rstrip("/")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process (unless attaching) and wait until /health answers 200."""
        command = self.spec.command
        if command is not None:
            if shutil.which(command[0]) is None:
                raise EngineStartError(
                    f"{self.spec.engine} is not installed here: {command[0]!r} not found "
                    f"(set SPECOPS_BENCH_{self.spec.engine.upper()}_COMMAND or attach a URL)"
                )
            # Closed (a temporary one deleted) by stop(), which every path out of the bench reaches.
            if self.spec.log is not None:
                self._log = self.spec.log.open("ab")  # noqa: SIM115
            else:
                self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
                    prefix=f"specops-{self.spec.engine}-", suffix=".log"
                )
            env = os.environ | dict(self.spec.env or {})
            # A process group of its own: stop() ends the server and whatever it spawned.
            self._proc = subprocess.Popen(
                [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *command],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.start_timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineStartError(
                    f"the {self.spec.engine} server exited with code {self._proc.returncode} "
                    f"before it was ready: {self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"the {self.spec.engine} server at {self.url} was not ready after "
                    f"{self.spec.start_timeout_s:g} s: {self.log_tail()}"
                )
            time.sleep(POLL_S)

    def log_tail(self) -> str:
        """The end of the server's output (empty when attached)."""
        if self._log is None:
            return ""
        text = Path(self._log.name).read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
        return " | ".join(line for line in text.splitlines() if line.strip())

    def metrics_text(self) -> str:
        response = httpx.get(f"{self.url}/metrics", timeout=30.0)
        response.raise_for_status()
        return response.text

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after a grace period; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
