"""Attacks on `specops serve engine`: its body limit, its tenant identity, its metrics' labels;
and the engine server they are played on."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
from attack_kit import (
    MB,
    Observed,
    Target,
    attack,
    bearer,
    short,
)
from live_stack import (
    free_port,
    log,
)

ENGINE_MODEL = "smollm2-135m-instruct"
ENGINE_READY_TIMEOUT_S = 300.0

# --- the engine server -----------------------------------------------------------------


@contextmanager
def engine(root: Path, extra: Sequence[str]) -> Iterator[tuple[str, int]]:
    """`specops serve engine` on the 135M model, every tenant in the shared tier, with `extra`
    options (what the server needs to authenticate tenants, say); (url, pid)."""
    port = free_port()
    logfile = (root / "engine.log").open("wb")
    cmd = [
        sys.executable, "-m", "specops.cli", "serve", "engine", "--model", ENGINE_MODEL, "--device", "cpu",
        "--threads", "1", "--method", "suffix", "--security-tier", "shared", "--fallback", "ngram",
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip
    log(f"starting the engine server: {' '.join(cmd[2:])}")
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ENGINE_READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the engine server exited ({proc.returncode}); see {root / 'engine.log'}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine server was not ready in {ENGINE_READY_TIMEOUT_S:g} s")
            time.sleep(1)
        log(f"engine server ready on {url} (pid {proc.pid})")
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()


def rss(pid: int) -> int:
    """Resident memory of the process and its children, bytes."""
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


@dataclass
class RawAnswer:
    status: int | None
    body: bytes
    elapsed_s: float
    sent_bytes: int
    error: str = ""


def raw_post(
    url: str, path: str, head: bytes, filler: bytes, tail: bytes, size: int, timeout_s: float
) -> RawAnswer:
    """POST a body of `size` bytes (head, filler repeated, tail) over a plain socket, stopping
    to send as soon as the server answers: a server that refuses early is seen doing so."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    begin = time.monotonic()
    sent = 0
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(request)

        def chunks() -> Iterator[bytes]:
            yield head
            left = size - len(head) - len(tail)
            while left > 0:
                piece = filler[: min(len(filler), left)]
                left -= len(piece)
                yield piece
            yield tail

        try:
            for chunk in chunks():
                if select.select([sock], [], [], 0)[0]:
                    break  # it answered before the body was whole
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError as exc:
            if not select.select([sock], [], [], 1)[0]:
                return RawAnswer(None, b"", time.monotonic() - begin, sent, repr(exc))
        received = b""
        try:
            while time.monotonic() - begin < timeout_s:
                if not select.select([sock], [], [], max(0.0, timeout_s - (time.monotonic() - begin)))[0]:
                    break
                data = sock.recv(65536)
                if not data:
                    break
                received += data
                if b"\r\n\r\n" in received and _whole(received):
                    break
        except OSError as exc:
            if not received:
                return RawAnswer(None, b"", time.monotonic() - begin, sent, repr(exc))
    elapsed = time.monotonic() - begin
    if not received.startswith(b"HTTP/"):
        return RawAnswer(None, received, elapsed, sent, "no answer")
    status = int(received.split(b" ", 2)[1])
    return RawAnswer(status, received.split(b"\r\n\r\n", 1)[1], elapsed, sent)


def _whole(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


class Sampler:
    """While in a `with`: the peak RSS of the engine and each /health answer's latency."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.peak = 0
        self.health: list[float | None] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss), threading.Thread(target=self._health)]

    def __enter__(self) -> Sampler:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _rss(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.target.engine_pid))
            time.sleep(0.05)

    def _health(self) -> None:
        while not self._stop.is_set():
            begin = time.monotonic()
            try:
                ok = httpx.get(f"{self.target.engine_url}/health", timeout=30).status_code == 200
                self.health.append(time.monotonic() - begin if ok else None)
            except httpx.HTTPError:
                self.health.append(None)
            time.sleep(0.25)


@attack(
    "engine-body-limit",
    "a 20 MB /v1/completions body: 413 in OpenAI's error shape within 3 s; engine RSS (peak) within 100 "
    "MB of before; /health answers (< 2 s) meanwhile",
)
def engine_body_limit(t: Target) -> Observed:
    size = 20 * 1000 * 1000
    head = json.dumps({"model": ENGINE_MODEL, "max_tokens": 4, "prompt": ""}).encode()[:-2]
    before = rss(t.engine_pid)
    with Sampler(t) as sampler:
        answer = raw_post(t.engine_url, "/v1/completions", head, b"lorem ipsum " * 8192, b'"}', size, 120.0)
        time.sleep(1.0)
    after = rss(t.engine_pid)
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    openai = isinstance(body, dict) and isinstance(body.get("error"), dict)
    growth = (max(sampler.peak, after) - before) / MB
    slow = [h for h in sampler.health if h is None or h >= 2.0]
    worst = max((h for h in sampler.health if h is not None), default=0.0)
    observed = (
        f"status {answer.status}{' (' + answer.error + ')' if answer.error else ''} "
        f"after {answer.elapsed_s:.1f} s "
        f"({answer.sent_bytes / MB:.1f} MiB sent), OpenAI error shape {openai}: {short(answer.body, 120)}; "
        f"RSS {before / MB:.0f} -> peak {sampler.peak / MB:.0f}, after {after / MB:.0f} MiB; "
        f"/health {len(sampler.health)} probes, slowest {worst:.1f} s, "
        f"{sum(h is None for h in sampler.health)} failed"
    )
    held = answer.status == 413 and openai and answer.elapsed_s <= 3.0 and growth <= 100 and not slow
    return (observed, held)


def completion(
    t: Target, headers: dict[str, str], prompt: str = "def add(a, b):\n    return"
) -> httpx.Response:
    body = {"model": ENGINE_MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{t.engine_url}/v1/completions", json=body, headers=headers, timeout=120)


@attack(
    "engine-tenant-claim",
    "shared tier: a request claiming the victim's tenant with X-Specops-Tenant and no "
    "X-Specops-Signature is refused (401/403), so the victim's drafts are not served to it",
)
def engine_tenant_claim(t: Target) -> Observed:
    victim = f"victim-{uuid.uuid4().hex[:8]}"
    # The victim's traffic first: what the attacker would draft from if the claim were taken.
    completion(t, {"X-Specops-Tenant": victim})
    forged = completion(t, {"X-Specops-Tenant": victim, "X-Specops-Workload": "chat"})
    detail = short(forged.text, 140)
    observed = f"claim of {victim} without a signature: {forged.status_code} {detail}"
    if forged.status_code == 200:
        usage = forged.json().get("usage", {})
        observed += f"; served as the victim (usage {usage})"
    return (observed, forged.status_code in (401, 403))


@attack(
    "metrics-tenant-labels",
    "after requests naming several tenants in X-Specops-Tenant (unsigned and with a bogus signature), "
    "no tenant name is a label value on the engine's /metrics or the gateway's /metrics",
)
def metrics_tenant_labels(t: Target) -> Observed:
    names = [f"leak-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    token_tenant = f"metrics-{uuid.uuid4().hex[:8]}"
    token = t.tenant_token(token_tenant)
    for i, name in enumerate(names):
        headers = {"X-Specops-Tenant": name, "X-Specops-Workload": f"w{i}"}
        if i == 2:
            headers["X-Specops-Signature"] = "0" * 64
        completion(t, headers)
        httpx.get(t.api("/runs"), headers=bearer(token) | headers, timeout=30)
    scraped = {
        "engine": httpx.get(f"{t.engine_url}/metrics", timeout=30),
        "gateway": httpx.get(t.stack.metrics_url("gateway"), timeout=30),
    }
    failed = {where: r.status_code for where, r in scraped.items() if r.status_code != 200}
    if failed:
        return f"/metrics not scraped: {failed}", False
    leaks = [
        f"{where}: {name}"
        for where, r in scraped.items()
        for name in [*names, token_tenant]
        if f'="{name}"' in r.text
    ]
    observed = f"tenant label values found: {leaks}" if leaks else "no tenant name in either /metrics"
    return (observed, not leaks)
