"""A live `specops up` on a scratch state dir, as the suites that attack one drive it
(bench/chaos.py, bench/attack.py): real NATS, PostgreSQL, the services as their own
processes and the real 135M model, with benches and gates shrunk by settings."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nats

from specbus.envelope import new_event
from specbus.publish import MSG_ID
from specbus.subjects import intake_subject
from specops.runtime.nats_auth import ADMIN, Keys
from specops.runtime.state import StateDir
from specops.runtime.supervisor import down, status, up
from specops_schemas.api import RunCreateRequest
from specops_schemas.events import RunRequested
from specplatform.settings import STATE_DIR_ENV, Settings

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
# Runs of 1 rep x 1 prompt x 8 tokens, gates of 1 prompt: the faults are the point, not speedups.
TINY = {
    "SPECOPS_BENCH_REPS": "1",
    "SPECOPS_BENCH_PROMPTS": "1",
    "SPECOPS_BENCH_NEW_TOKENS": "8",
    "SPECOPS_GATE_PROMPTS": "1",
    "SPECOPS_GATE_NEW_TOKENS": "8",
    "SPECOPS_GATE_BATCH_SIZE": "1",
    "SPECOPS_BENCH_DEVICE": "cpu",
    "SPECOPS_GATE_DEVICE": "cpu",
    "OMP_WAIT_POLICY": "PASSIVE",
}
READY_TIMEOUT_S = 300.0


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    settings: Settings
    url: str
    database_url: str
    nats_url: str
    root: Path

    @property
    def admin_seed(self) -> str:
        return str(Keys(self.settings.state_dir).seed_file(ADMIN))

    @property
    def env(self) -> dict[str, str]:
        """The environment a `specops` command of this stack runs with."""
        return os.environ | {STATE_DIR_ENV: str(self.settings.state_dir)}

    def pid_or_none(self, service: str, replica: int = 0) -> int | None:
        for p in status(self.settings).processes:
            if p.service == service and p.replica == replica and p.alive:
                return p.pid
        return None

    def pid(self, service: str, replica: int = 0) -> int:
        pid = self.pid_or_none(service, replica)
        if pid is None:
            raise RuntimeError(f"{service}[{replica}] is not running")
        return pid

    def metrics_url(self, service: str, replica: int = 0) -> str:
        """Where the process serves its /metrics."""
        for p in status(self.settings).processes:
            if p.service == service and p.replica == replica and p.metrics_url:
                return p.metrics_url
        raise RuntimeError(f"{service}[{replica}] serves no /metrics")

    def server_pid(self, name: str) -> int:
        for s in status(self.settings).servers:
            if s.name == name and s.alive and s.pid is not None:
                return s.pid
        raise RuntimeError(f"{name} is not running")

    def healthy(self) -> bool:
        """`specops status` exit 0: every component up and reachable."""
        done = subprocess.run(
            [sys.executable, "-m", "specops.cli", "status"], env=self.env, capture_output=True, check=False
        )
        return done.returncode == 0


@contextmanager
def stack(replicas: dict[str, int], *, prefix: str, keep: bool = False) -> Iterator[Stack]:
    """`specops up` on a fresh state dir under /tmp, healthy; `down` (and the dir removed
    unless `keep`) after."""
    root = Path(tempfile.mkdtemp(prefix=f"specops-{prefix}-"))
    port = free_port()
    for name in ("NATS_URL", "DATABASE_URL", "NATS_NKEY_SEED_FILE", "NATS_CREDS_FILE", "SPECOPS_URL"):
        os.environ.pop(name, None)
    os.environ.update(TINY | {"SPECOPS_GATEWAY_HOST": "127.0.0.1", "SPECOPS_GATEWAY_PORT": str(port)})
    settings = Settings(state_dir=root / "state", nats_url=None, database_url=None)
    try:
        result = up(settings, replicas, progress=log)
        servers = {s.name: s.url for s in result.servers}
        running = Stack(settings, f"http://127.0.0.1:{port}", servers["postgres"], servers["nats"], root)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not running.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stack was not healthy after {READY_TIMEOUT_S:g} s; logs in {root}")
            time.sleep(2)
        yield running
    finally:
        down(settings, progress=log)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def stop_watcher(stack: Stack) -> None:
    """The watcher would start a stopped component again at once: the operator's way to hold
    one down is to stop the watcher; `specops up` starts both again."""
    watcher = StateDir(stack.settings.state_dir).load().watcher
    if watcher is not None and watcher.alive():
        os.kill(watcher.pid, signal.SIGTERM)
        while watcher.alive():
            time.sleep(0.1)


# --- the stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamMessage:
    seq: int
    subject: str
    msg_id: str
    data: bytes


async def stream_messages(
    stack: Stack, stream: str = "SPEC", subjects: str = "spec.>"
) -> list[StreamMessage]:
    """Every message on `stream`, in order."""
    nc = await nats.connect(stack.nats_url, nkeys_seed=stack.admin_seed)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        sub = await js.subscribe(subjects, ordered_consumer=True, stream=stream)
        found = []
        for _ in range(info.state.messages):
            msg = await sub.next_msg(timeout=10)
            found.append(
                StreamMessage(
                    msg.metadata.sequence.stream, msg.subject, (msg.headers or {}).get(MSG_ID, ""), msg.data
                )
            )
        await sub.unsubscribe()
        return found
    finally:
        await nc.close()


@dataclass(frozen=True)
class Letter:
    seq: int
    """The dead letter's own stream sequence (what `specops dlq show` takes)."""
    msg_id: str
    """The parked message's Nats-Msg-Id."""
    service: str
    error: str


async def dead_letters(stack: Stack) -> list[Letter]:
    """Every dead letter on the stream."""
    letters = []
    for m in await stream_messages(stack):
        if m.subject.startswith("spec.dlq."):
            letter = json.loads(m.data)
            letters.append(
                Letter(m.seq, letter["headers"].get(MSG_ID, ""), letter["service"], letter["error"])
            )
    return letters


async def publish_as_admin(stack: Stack, messages: dict[str, tuple[str, bytes]], ids: dict[str, str]) -> None:
    """Publish each named (subject, body) with its Nats-Msg-Id from `ids`."""
    nc = await nats.connect(stack.nats_url, nkeys_seed=stack.admin_seed)
    try:
        js = nc.jetstream()
        for name, (subject, body) in messages.items():
            await js.publish(subject, body, headers={MSG_ID: ids[name]})
    finally:
        await nc.close()


def poison_messages() -> dict[str, tuple[str, bytes]]:
    """name -> (subject, body) of each poison message."""
    fake = f"poison{uuid.uuid4().hex[:8]}"
    request = RunCreateRequest.model_validate({"target": TARGET, "workload": {"fingerprint": "chat"}})
    valid = new_event(
        RunRequested(run_id=fake, request=request, requested_by="tok_poison"),
        tenant_id="poison",
        correlation_id=fake,
        producer="gateway",
    )
    body = json.loads(valid.to_json_bytes())
    requested = valid.subject
    return {
        "nested": (requested, b"[" * 5000 + b"]" * 5000),
        "oversized": (requested, b'{"pad": "' + b"x" * 900_000 + b'"}'),
        "invalid-json": (requested, b"{not json"),
        "unknown-type": (requested, json.dumps(body | {"type": "run.exploded"}).encode()),
        "wrong-schema-version": (requested, json.dumps(body | {"schema_version": 99}).encode()),
        "unknown-tenant": (
            intake_subject("poison-nobody"),
            json.dumps({"event_id": str(uuid.uuid4()), "request": request.model_dump(mode="json")}).encode(),
        ),
    }


def wait_parked(
    stack: Stack, ids: dict[str, str], timeout_s: float = 180.0
) -> tuple[dict[str, dict[str, int]], list[Letter]]:
    """Wait until every message of `ids` (name -> Nats-Msg-Id) is parked at least once;
    name -> {service: letters}, and the letters."""
    deadline = time.monotonic() + timeout_s
    while True:
        letters = asyncio.run(dead_letters(stack))
        parked: dict[str, dict[str, int]] = {name: {} for name in ids}
        for name, msg_id in ids.items():
            for letter in letters:
                if letter.msg_id == msg_id:
                    parked[name][letter.service] = parked[name].get(letter.service, 0) + 1
        if all(parked.values()) or time.monotonic() > deadline:
            return parked, letters
        time.sleep(2)
