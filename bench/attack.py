"""`make attack`: attacks replayed against a live stack and engine server; each must hold.

One `specops up` on a scratch state dir (real NATS, PostgreSQL, the services as their own
processes, the real 135M model; bench/live_stack.py) and one `specops serve engine` on the
same model (suffix drafting, drift control on, every tenant in the `shared` tier), then one
attack after another. Each is independent: one that fails or raises is recorded and the
next runs. A row says what was expected, what was observed and whether it held; the rows
are written to --out after each attack, and docs/results/attack.md is generated from them.
The exit status is 1 when any attack did not hold.

Issue 41's findings (the behaviour its fixes promise) and the earlier round's attacks:

- engine-body-limit: a 20 MB /v1/completions body is a 413 within 3 s, RSS within 100 MB;
- engine-tenant-claim: a bare X-Specops-Tenant claim, unsigned, is refused (401/403);
- audit-tail-delete / audit-rewrite: the newest rows deleted with the chain head moved back,
  or one row's content rewritten with the chain recomputed, fail `audit verify --against-stream`;
- intake-dedup: tenant B's intake message with tenant A's Nats-Msg-Id is accepted as B's run;
- storage-quota: one developer's datastore uploads are refused (413/429) at the quota;
- model-ref-probe: server paths as model_ref are refused alike, existing or not;
- dlq-show-nested: `specops dlq show` on a 100000-deep parked message exits 0;
- postgres-recovery: the gateway answers 200 within 5 s after PostgreSQL is back;
- console-sign-out: the session cookie is no API token and is refused after sign-out;
- metrics-tenant-labels: no tenant name is a label value on the engine's or gateway's /metrics;
- budgets: budgets of 1e30 (and infinity) are 4xx problems;
- forged-events, anonymous-nats, cross-tenant-reads, poison, api-abuse: the earlier round's.

    .venv/bin/python bench/attack.py --out bench/results/attack.json
    .venv/bin/python bench/attack.py --only intake-dedup   # rerun one; the other rows are kept
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, LiteralString
from urllib.parse import urlsplit

import httpx
import nats
import nkeys
import psutil
import psycopg
from common import fresh_token
from live_stack import (
    TARGET,
    Stack,
    free_port,
    log,
    poison_messages,
    publish_as_admin,
    stack,
    stop_watcher,
    stream_messages,
    wait_parked,
)

from specbus.publish import MSG_ID
from specbus.subjects import intake_answer_subject, intake_subject
from specops.runtime import postgres_server
from specops.runtime.nats_auth import Keys
from specops.runtime.state import StateDir
from specops.runtime.supervisor import SERVICES, add_tenant, up
from specops.runtime.topology import service_users
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role
from specops_schemas.security import PolicySettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from audit_tamper import rewrite_with_recomputed_chain  # noqa: E402

ENGINE_MODEL = "smollm2-135m-instruct"
ENGINE_READY_TIMEOUT_S = 300.0
RUN_BODY = {"target": TARGET, "workload": {"fingerprint": "chat"}, "goal": {"quality_gate": "topk5"}}
PROBLEM = "application/problem+json"
MB = 1024 * 1024
# What the storage quota is measured against when the policy has no such field (the round's
# upload that met no limit).
FALLBACK_QUOTA_BYTES = 198 * MB
ANSWER_TIMEOUT_S = 90.0
# The round's outage: long enough for the pool's reconnect backoff to grow (45 s of 503s after
# it on the tree it found; 3.7 s after a 60 s outage).
OUTAGE_S = 180.0


@dataclass
class Outcome:
    """One row of bench/results/attack.json."""

    name: str
    expected: str
    observed: str
    held: bool
    duration_s: float = 0.0


@dataclass
class Target:
    stack: Stack
    engine_url: str
    engine_pid: int
    outage_s: float

    def api(self, path: str) -> str:
        return f"{self.stack.url}{API_PREFIX}{path}"

    def token(self, prefix: str, role: Role = Role.DEVELOPER, tenant: str | None = None) -> str:
        return fresh_token(self.stack.database_url, prefix, name=f"attack-{prefix}", role=role, tenant=tenant)

    def tenant_token(self, tenant: str, role: Role = Role.DEVELOPER) -> str:
        return self.token(tenant, role, tenant)


Observed = tuple[str, bool]
"""What an attack saw, and whether that is what was expected."""


@dataclass(frozen=True)
class Attack:
    name: str
    expected: str
    run: Callable[[Target], Observed]


ATTACKS: dict[str, Attack] = {}


def attack(
    name: str, expected: str
) -> Callable[[Callable[[Target], Observed]], Callable[[Target], Observed]]:
    """Register an attack under `name`, with what must happen when it is played."""

    def register(run: Callable[[Target], Observed]) -> Callable[[Target], Observed]:
        ATTACKS[name] = Attack(name, expected, run)
        return run

    return register


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def is_problem(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith(PROBLEM)


def short(text: str | bytes, limit: int = 160) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_line(text: str) -> str:
    """What a traceback ends with: the error."""
    return next((line for line in reversed(text.splitlines()) if line.strip()), "")


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


# --- the audit ---------------------------------------------------------------------------


def verify(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specops.cli", "audit", "verify", "--against-stream"],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one(conn: psycopg.Connection[Any], sql: LiteralString) -> tuple[Any, ...]:
    row = conn.execute(sql).fetchone()
    if row is None:
        raise RuntimeError(f"no row for {sql}")
    return row


def audit_rows(t: Target, at_least: int = 3) -> None:
    """Make sure the audit log has rows and the audit service is caught up (quiet 3 s)."""
    with psycopg.connect(t.stack.database_url, autocommit=True) as conn:
        if one(conn, "SELECT count(*) FROM audit_log")[0] < at_least:
            token = t.token("audit")
            httpx.post(t.api("/runs"), json=RUN_BODY, headers=bearer(token), timeout=60).raise_for_status()
        deadline = time.monotonic() + 120
        last = -1
        while time.monotonic() < deadline:
            count = one(conn, "SELECT count(*) FROM audit_log")[0]
            if count >= at_least and count == last:
                return
            last = count
            time.sleep(3)


@attack(
    "audit-tail-delete",
    "the newest 2 audit rows deleted and the chain head moved back: `audit verify --against-stream` "
    "exits non-zero and names the gap (the missing stream sequences)",
)
def audit_tail_delete(t: Target) -> Observed:
    audit_rows(t)
    baseline = verify(t.stack)
    with psycopg.connect(t.stack.database_url, autocommit=True) as conn:
        cur = conn.execute("SELECT * FROM audit_log ORDER BY seq DESC LIMIT 2")
        columns = [c.name for c in cur.description or []]
        deleted = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")  # the append-only triggers off
            conn.execute("DELETE FROM audit_log WHERE seq = ANY(%s)", ([r["seq"] for r in deleted],))
            conn.execute(
                "UPDATE audit_chain_head SET seq = last.seq, hash = last.hash "
                "FROM (SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1) last"
            )
    tampered = verify(t.stack)
    try:
        restore_tail(t.stack.database_url, deleted, columns)
        restored = f"exit {verify(t.stack).returncode}"
    except psycopg.Error as exc:
        # A row the audit service appended meanwhile took the deleted rows' place in the chain.
        restored = f"not restored ({type(exc).__name__})"
    out = tampered.stdout + tampered.stderr
    marks = [str(r.get("stream_seq")) for r in deleted if r.get("stream_seq") is not None]
    named = bool(re.search(r"\bgaps?\b|\bmissing\b", out, re.IGNORECASE)) or any(
        re.search(rf"(?<![\w.]){m}(?![\w.])", out) for m in marks
    )
    observed = (
        f"before: exit {baseline.returncode}; rows seq {[r['seq'] for r in deleted]} "
        f"(stream seq {marks}) deleted: exit {tampered.returncode}, gap named {named}: {short(out, 200)}; "
        f"restored: {restored}"
    )
    return (observed, tampered.returncode != 0 and named)


def restore_tail(dsn: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Put deleted audit rows back and the chain head on the newest (what was there before)."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        names = ", ".join(columns)
        marks = ", ".join(f"%({c})s" for c in columns)
        for row in sorted(rows, key=lambda r: r["seq"]):
            conn.execute(f"INSERT INTO audit_log ({names}) VALUES ({marks})", row)
        conn.execute(
            "UPDATE audit_chain_head SET seq = last.seq, hash = last.hash "
            "FROM (SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1) last"
        )


@attack(
    "audit-rewrite",
    "one audit row's content changed and every hash after it recomputed (the earlier round's rewrite): "
    "`audit verify --against-stream` exits non-zero",
)
def audit_rewrite(t: Target) -> Observed:
    audit_rows(t)
    with psycopg.connect(t.stack.database_url, autocommit=True) as conn:
        seq, payload = one(conn, "SELECT seq, payload FROM audit_log ORDER BY seq DESC OFFSET 1 LIMIT 1")
    forged = json.loads(payload)
    forged["tenant_id"] = "someone-else"
    rewrite_with_recomputed_chain(t.stack.database_url, seq, json.dumps(forged).encode())
    try:
        tampered = verify(t.stack)
    finally:
        rewrite_with_recomputed_chain(t.stack.database_url, seq, bytes(payload))
    restored = verify(t.stack)
    observed = (
        f"row {seq} rewritten: exit {tampered.returncode}: {short(tampered.stdout + tampered.stderr, 200)}; "
        f"restored: exit {restored.returncode}"
    )
    return (observed, tampered.returncode != 0)


# --- NATS --------------------------------------------------------------------------------


@dataclass
class NatsUser:
    seed_file: str
    inbox_prefix: str | None = None


def tenant_user(t: Target, tenant: str) -> NatsUser:
    user = add_tenant(t.stack.settings, tenant)
    return NatsUser(user.seed_file, user.inbox_prefix)


async def connect(t: Target, user: NatsUser, errors: list[str]) -> nats.NATS:
    async def record(exc: Exception) -> None:
        errors.append(str(exc))

    options: dict[str, Any] = {"inbox_prefix": user.inbox_prefix} if user.inbox_prefix else {}
    # A user just added is known once nats-server has reloaded its config: a moment.
    deadline = time.monotonic() + 15
    while True:
        try:
            return await nats.connect(
                t.stack.nats_url,
                nkeys_seed=user.seed_file,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=record,
                **options,
            )
        except nats.errors.Error:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@attack(
    "intake-dedup",
    "tenant A publishes an intake request with Nats-Msg-Id Y, then tenant B (its own NATS user) one "
    "with the same Y: B hears `accepted` with its own run on specops.results.<B>.intake.accepted",
)
def intake_dedup(t: Target) -> Observed:
    a, b = (f"intake-{x}-{uuid.uuid4().hex[:6]}" for x in "ab")
    for tenant in (a, b):
        t.tenant_token(tenant)  # the tenant's record: the intake refuses a tenant without one
    users = {tenant: tenant_user(t, tenant) for tenant in (a, b)}
    msg_id = f"order-{uuid.uuid4().hex[:8]}"

    async def publish(tenant: str) -> tuple[dict[str, Any] | None, str, bool]:
        errors: list[str] = []
        nc = await connect(t, users[tenant], errors)
        try:
            accepted = await nc.subscribe(intake_answer_subject(tenant, "accepted"))
            rejected = await nc.subscribe(intake_answer_subject(tenant, "rejected"))
            event_id = str(uuid.uuid4())
            body = json.dumps({"event_id": event_id, "request": RUN_BODY}).encode()
            ack = await nc.jetstream().publish(intake_subject(tenant), body, headers={MSG_ID: msg_id})
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while time.monotonic() < deadline:
                for sub, kind in ((accepted, "accepted"), (rejected, "rejected")):
                    try:
                        msg = await sub.next_msg(timeout=0.5)
                    except nats.errors.TimeoutError:
                        continue
                    answer = json.loads(msg.data)
                    if answer.get("event_id") == event_id:
                        return answer | {"answer": kind}, event_id, bool(ack.duplicate)
            return None, event_id, bool(ack.duplicate)
        finally:
            await nc.close()

    first, _, _ = asyncio.run(publish(a))
    second, _, duplicate = asyncio.run(publish(b))
    a_run = (first or {}).get("run_id")
    b_run = (second or {}).get("run_id")
    observed = (
        f"A: {(first or {}).get('answer', 'no answer')} run {a_run}; B (same Nats-Msg-Id {msg_id}): "
        f"publish ack duplicate={duplicate}, "
        f"{(second or {}).get('answer', f'no answer in {ANSWER_TIMEOUT_S:g} s')} run {b_run}"
    )
    held = second is not None and second["answer"] == "accepted" and b_run is not None and b_run != a_run
    return (observed, held)


def covers(pattern: str, subject: str) -> bool:
    """Whether a NATS subject pattern (`*`, `>`) matches `subject`."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


@attack(
    "forged-events",
    "a RunCompleted-like event on spec.run.<id>.completed and a GateEvaluated-like one on "
    "spec.gate.<id>.evaluated, published with a tenant's NATS user and with a service user without that "
    "permission: NATS refuses both (publish permission violation), nothing reaches the stream and the "
    "run is unchanged in the gateway",
)
def forged_events(t: Target) -> Observed:
    token = t.token("forge")
    run = httpx.post(t.api("/runs"), json=RUN_BODY, headers=bearer(token), timeout=60).json()
    run_id = run["id"]
    subjects = [f"spec.run.{run_id}.completed", f"spec.gate.{run_id}.evaluated"]
    keys = Keys(t.stack.settings.state_dir)
    service = next(
        u.name for u in service_users() if not any(covers(p, s) for p in u.publishes for s in subjects)
    )
    users = {
        "tenant": tenant_user(t, f"forge-{uuid.uuid4().hex[:6]}"),
        service: NatsUser(str(keys.seed_file(service))),
    }
    forged_ids: list[str] = []
    refusals: dict[str, int] = {}

    async def forge(who: str, user: NatsUser) -> None:
        errors: list[str] = []
        nc = await connect(t, user, errors)
        try:
            for subject in subjects:
                msg_id = f"forged-{uuid.uuid4().hex}"
                forged_ids.append(msg_id)
                body = {
                    "event_id": str(uuid.uuid4()),
                    "type": subject.rsplit(".", 2)[-2] + "." + subject.rsplit(".", 1)[-1],
                    "tenant_id": "forge",
                    "payload": {
                        "run_id": run_id,
                        "winner": {"family": "ngram", "speedup": 99.0},
                        "passed": True,
                    },
                }
                await nc.publish(subject, json.dumps(body).encode(), headers={MSG_ID: msg_id})
            await nc.flush()
            await asyncio.sleep(1.0)
        finally:
            await nc.close()
        refusals[who] = sum("permissions violation for publish" in e.lower() for e in errors)

    for who, user in users.items():
        asyncio.run(forge(who, user))
    on_stream = [m for m in asyncio.run(stream_messages(t.stack)) if m.msg_id in forged_ids]
    after = httpx.get(t.api(f"/runs/{run_id}"), headers=bearer(token), timeout=30).json()
    observed = (
        f"publish violations {refusals} (of {len(subjects)} each); "
        f"forged messages on the stream: {len(on_stream)}; "
        f"run {run_id} status {after.get('status')}, winner {after.get('winner')}"
    )
    changed = (after.get("winner") or {}).get("speedup") == 99.0
    held = all(n == len(subjects) for n in refusals.values()) and not on_stream and not changed
    return (observed, held)


@attack("anonymous-nats", "a NATS connection without credentials, and one with an unknown nkey, is refused")
def anonymous_nats(t: Target) -> Observed:
    seen = []

    async def quiet(exc: Exception) -> None:
        """The refusal is the observation; nats-py would log it with a traceback."""

    async def attempt(**options: Any) -> str:
        try:
            nc = await nats.connect(
                t.stack.nats_url, allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet, **options
            )
        except Exception as exc:  # noqa: BLE001 - what refused it is the observation
            return f"refused: {short(str(exc) or repr(exc), 80)}"
        await nc.close()
        return "connected"

    seen.append(asyncio.run(attempt()))
    with tempfile.NamedTemporaryFile("wb", suffix=".nk") as seed:
        seed.write(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
        seed.flush()
        seen.append(asyncio.run(attempt(nkeys_seed=seed.name)))
    observed = f"no credentials: {seen[0]}; unknown nkey: {seen[1]}"
    return (observed, all(s.startswith("refused") for s in seen))


@attack(
    "poison",
    "nested, oversized, invalid-JSON, unknown-type, wrong-schema-version and unknown-tenant messages "
    "are each parked on a dead-letter subject; every component stays healthy",
)
def poison(t: Target) -> Observed:
    messages = poison_messages()
    ids = {name: f"attack-poison-{name}-{uuid.uuid4().hex[:8]}" for name in messages}
    asyncio.run(publish_as_admin(t.stack, messages, ids))
    parked, _ = wait_parked(t.stack, ids)
    healthy = t.stack.healthy()
    never = [name for name, by in parked.items() if not by]
    observed = f"parked: {parked}; never parked: {never}; `specops status` healthy: {healthy}"
    return (observed, not never and healthy)


@attack(
    "dlq-show-nested",
    "a message nested 100000 levels, parked: `specops dlq show SEQ` (and --json) exits 0, no traceback",
)
def dlq_show_nested(t: Target) -> Observed:
    messages = poison_messages()
    subject = messages["nested"][0]
    ids = {"deep": f"attack-deep-{uuid.uuid4().hex[:8]}"}
    asyncio.run(publish_as_admin(t.stack, {"deep": (subject, b"[" * 100_000 + b"]" * 100_000)}, ids))
    parked, letters = wait_parked(t.stack, ids)
    mine = [x for x in letters if x.msg_id == ids["deep"]]
    if not mine:
        return (f"never parked: {parked}", False)
    results = []
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "specops.cli", "dlq", "show", str(mine[0].seq), *extra],
            env=t.stack.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        results.append(
            (extra, done.returncode, "Traceback" in done.stderr, short(last_line(done.stderr), 120))
        )
    observed = "; ".join(
        f"dlq show {mine[0].seq}{' --json' if extra else ''}: exit {rc}, "
        f"traceback {tb}{': ' + err if rc else ''}"
        for extra, rc, tb, err in results
    )
    return (observed, all(rc == 0 and not tb for _, rc, tb, _ in results))


# --- the gateway ---------------------------------------------------------------------------


@attack(
    "storage-quota",
    "one developer token uploading 32 MiB datastores is refused with a 413/429 problem+json giving the "
    "numbers before it stores more than the policy's default quota (PolicySettings.storage_quota_bytes; "
    "198 MiB, the round's upload, where the policy has no such field)",
)
def storage_quota(t: Target) -> Observed:
    default = PolicySettings.model_fields.get("storage_quota_bytes")
    quota = default.default if default is not None and isinstance(default.default, int) else None
    bound = quota if quota is not None else FALLBACK_QUOTA_BYTES
    source = (
        "PolicySettings.storage_quota_bytes" if quota is not None else "no storage_quota_bytes in the policy"
    )
    token = t.token("quota")
    chunk = 32 * MB
    base = b"the quick brown fox jumps over the lazy dog\n" * (chunk // 44)
    stored = 0
    answer: httpx.Response | None = None
    with httpx.Client(timeout=300) as client:
        for i in range(bound // chunk + 2):
            body = f"upload {i} {uuid.uuid4()}\n\n".encode() + base
            answer = client.post(
                t.api("/datastores"),
                params={"name": f"quota-{i}"},
                content=body,
                headers=bearer(token) | {"Content-Type": "text/plain"},
            )
            if answer.status_code >= 400:
                break
            stored += len(body)
    assert answer is not None
    if answer.status_code < 400:
        return f"quota {bound / MB:.0f} MiB ({source}): stored {stored / MB:.0f} MiB, never refused", False
    refused = answer.status_code in (413, 429)
    numbers = refused and is_problem(answer) and any(c.isdigit() for c in answer.json().get("detail", ""))
    observed = (
        f"quota {bound / MB:.0f} MiB ({source}): stored {stored / MB:.0f} MiB, then {answer.status_code} "
        f"{answer.headers.get('content-type')}: "
        f"{short(answer.text, 200)}"
    )
    return (observed, refused and numbers and stored <= bound)


@attack(
    "model-ref-probe",
    "POST runs with model_ref /etc, a server directory holding a config.json, ../.. and a path that "
    "does not exist: all refused with the same status, type and message (no existence oracle)",
)
def model_ref_probe(t: Target) -> Observed:
    token = t.token("probe")
    with tempfile.TemporaryDirectory(prefix="attack-model-") as tmp:
        (Path(tmp) / "config.json").write_text('{"model_type": "llama"}')
        refs = ["/etc", tmp, "../..", f"/nonexistent-{uuid.uuid4().hex[:8]}"]
        answers = {}
        for ref in refs:
            body = RUN_BODY | {"target": TARGET | {"model_ref": ref}}
            r = httpx.post(t.api("/runs"), json=body, headers=bearer(token), timeout=60)
            detail = r.json().get("detail", "") if is_problem(r) else r.text
            answers[ref] = (
                r.status_code,
                r.json().get("type") if is_problem(r) else None,
                detail.replace(ref, "<ref>"),
            )
    shapes = set(answers.values())
    observed = "; ".join(f"{ref}: {s} {short(d, 90)}" for ref, (s, _, d) in answers.items())
    held = len(shapes) == 1 and all(400 <= s < 500 for s, _, _ in shapes)
    return (observed, held)


@attack(
    "postgres-recovery",
    "PostgreSQL stopped (--postgres-outage-s), with requests all along, then started: the gateway "
    "answers GET runs with 200 within 5 s of PostgreSQL accepting connections",
)
def postgres_recovery(t: Target) -> Observed:
    token = t.token("pg")
    record = StateDir(t.stack.settings.state_dir).load().servers["postgres"]
    stop_watcher(t.stack)
    log(f"stopping postgres for {t.outage_s:g} s")
    postgres_server.stop(record)
    # Traffic all through the outage, as users would send: the gateway's pool keeps failing.
    during: set[int] = set()
    until = time.monotonic() + t.outage_s
    while time.monotonic() < until:
        during.add(httpx.get(t.api("/runs"), headers=bearer(token), timeout=30).status_code)
        time.sleep(2)
    marks: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and "gateway" not in marks:
            if "postgres" not in marks:
                try:
                    with psycopg.connect(t.stack.database_url, connect_timeout=1):
                        marks["postgres"] = time.monotonic()
                except psycopg.Error:
                    time.sleep(0.1)
                continue
            try:
                if httpx.get(t.api("/runs"), headers=bearer(token), timeout=10).status_code == 200:
                    marks["gateway"] = time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    log("starting postgres again (specops up)")
    try:
        up(t.stack.settings, None, progress=log)
        watcher.join(timeout=120)
    finally:
        done.set()
        watcher.join()
    if "postgres" not in marks or "gateway" not in marks:
        return (f"{t.outage_s:g} s outage, answers during it: {sorted(during)}; marks {marks}", False)
    took = marks["gateway"] - marks["postgres"]
    observed = (
        f"{t.outage_s:g} s outage, answers during it: {sorted(during)}; first 200 {took:.1f} s after "
        "PostgreSQL accepted connections"
    )
    return (observed, took <= 5.0)


@attack(
    "console-sign-out",
    "console sign-in sets a session cookie that is not the API token; after sign-out the old cookie is "
    "refused on the console and the API",
)
def console_sign_out(t: Target) -> Observed:
    from specops_services.gateway.http.credentials import CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE

    token = t.token("console")
    with httpx.Client(base_url=t.stack.url, timeout=30, follow_redirects=False) as client:
        client.get("/ui/sign-in")
        csrf = client.cookies.get(CSRF_COOKIE)
        signed = client.post("/ui/sign-in", data={"token": token, "csrf": csrf})
        session = client.cookies.get(SESSION_COOKIE)
        csrf = client.cookies.get(CSRF_COOKIE)
        page = client.get("/ui/runs").status_code
        out = client.post("/ui/sign-out", data={"csrf": csrf}).status_code
    if session is None:
        return (f"sign-in answered {signed.status_code}, no session cookie", False)
    old = {"Cookie": f"{SESSION_COOKIE}={session}; {CSRF_COOKIE}={csrf}"}
    replay_page = httpx.get(f"{t.stack.url}/ui/runs", headers=old, timeout=30, follow_redirects=False)
    replay_api = httpx.get(t.api("/runs"), headers=old | {CSRF_HEADER: csrf or ""}, timeout=30)
    is_token = session == token
    observed = (
        f"sign-in {signed.status_code}, cookie is the API token: {is_token}; /ui/runs {page}; "
        f"sign-out {out}; "
        f"old cookie then: /ui/runs {replay_page.status_code} {replay_page.headers.get('location', '')}, "
        f"GET runs {replay_api.status_code}"
    )
    held = not is_token and replay_page.status_code != 200 and replay_api.status_code in (401, 403)
    return (observed, held)


@attack(
    "budgets",
    "gpu_budget_s 1e30 or infinite in the security policy, budget_minutes 1e30 on tune sessions and "
    "head training, gpu_budget_s on a run: each a 4xx problem+json",
)
def budgets(t: Target) -> Observed:
    admin = t.token("budget", Role.ADMIN)
    cases = [
        ("PUT", "/security/policy", b'{"gpu_budget_s": 1e30}'),
        ("PUT", "/security/policy", b'{"gpu_budget_s": 1e999}'),
        ("POST", "/tune-sessions", b'{"run_id": "run_none", "budget_minutes": 1e30}'),
        ("POST", "/heads/train", b'{"data": "' + b"0" * 64 + b'", "budget_minutes": 1e30}'),
        ("POST", "/runs", json.dumps(RUN_BODY | {"gpu_budget_s": 1e30}).encode()),
    ]
    seen = []
    for method, path, body in cases:
        r = httpx.request(
            method,
            t.api(path),
            content=body,
            headers=bearer(admin) | {"Content-Type": "application/json"},
            timeout=120,
        )
        seen.append((method, path, body.decode()[:50], r.status_code, is_problem(r)))
    observed = "; ".join(f"{m} {p} {b}: {s}{'' if pr else ' (not a problem)'}" for m, p, b, s, pr in seen)
    return (observed, all(400 <= s < 500 and pr for *_, s, pr in seen))


@attack(
    "cross-tenant-reads",
    "tenant B's token reading tenant A's run, its events and A's datastore: 404 each, as for an id that "
    "does not exist",
)
def cross_tenant_reads(t: Target) -> Observed:
    a, b = t.token("cross-a"), t.token("cross-b")
    run = httpx.post(t.api("/runs"), json=RUN_BODY, headers=bearer(a), timeout=60).json()
    store = httpx.post(
        t.api("/datastores"),
        params={"name": "a-secret"},
        content=b"tenant A's corpus\n",
        headers=bearer(a) | {"Content-Type": "text/plain"},
        timeout=60,
    ).json()
    paths = [
        f"/runs/{run['id']}",
        f"/runs/{run['id']}/events",
        f"/datastores/{store['id']}",
        "/runs/run_doesnotexist0",
    ]
    seen = {}
    with httpx.Client(timeout=30) as client:
        for path in paths:
            with client.stream("GET", t.api(path), headers=bearer(b)) as r:
                seen[path] = r.status_code
    observed = ", ".join(f"{p}: {s}" for p, s in seen.items())
    return (observed, all(s == 404 for s in seen.values()))


# Refused by the HTTP server (uvicorn) before the app: a 4xx in its own format, or the
# connection closed, is the refusal.
SERVER_LEVEL = {"1 MiB header"}


@attack(
    "api-abuse",
    "30 malformed requests (bad JSON, huge headers, unknown fields, wrong types, negative limits, path "
    "traversal in ids, bad Idempotency-Key, oversized bodies): every answer a 4xx problem+json (a header "
    "too large for the HTTP server: its 4xx or the connection closed), no 5xx",
)
def api_abuse(t: Target) -> Observed:
    token = t.token("abuse")
    json_h = bearer(token) | {"Content-Type": "application/json"}
    run = json.dumps(RUN_BODY).encode()
    nested = b'{"target": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases: list[tuple[str, str, str, dict[str, str], bytes]] = [
        ("bad JSON", "POST", "/runs", json_h, b"{not json"),
        ("JSON array", "POST", "/runs", json_h, b"[]"),
        ("empty body", "POST", "/runs", json_h, b""),
        ("unknown field", "POST", "/runs", json_h, json.dumps(RUN_BODY | {"surprise": 1}).encode()),
        ("wrong type", "POST", "/runs", json_h, json.dumps(RUN_BODY | {"workload": 5}).encode()),
        ("unknown enum", "POST", "/runs", json_h, json.dumps(RUN_BODY | {"mode": "ludicrous"}).encode()),
        (
            "NaN",
            "POST",
            "/runs",
            json_h,
            run.replace(b'"topk5"}', b'"topk5", "priorities": {"throughput": NaN}}'),
        ),
        (
            "NUL in model_ref",
            "POST",
            "/runs",
            json_h,
            json.dumps(RUN_BODY | {"target": TARGET | {"model_ref": "a\x00b"}}).encode(),
        ),
        ("nested 100000", "POST", "/runs", json_h, nested),
        ("oversized body 4 MiB", "POST", "/runs", json_h, b'{"pad": "' + b"x" * (4 * MB) + b'"}'),
        ("text/plain body", "POST", "/runs", bearer(token) | {"Content-Type": "text/plain"}, run),
        ("negative limit", "GET", "/runs?limit=-1", bearer(token), b""),
        ("huge limit", "GET", "/runs?limit=100000000000000000000", bearer(token), b""),
        ("limit not a number", "GET", "/runs?limit=abc", bearer(token), b""),
        ("traversal in run id", "GET", "/runs/..%2F..%2Fetc%2Fpasswd", bearer(token), b""),
        ("NUL in run id", "GET", "/runs/%00", bearer(token), b""),
        ("600-char run id", "GET", "/runs/" + "a" * 600, bearer(token), b""),
        ("traversal in datastore id", "GET", "/datastores/..%2F..%2F..%2Fetc", bearer(token), b""),
        ("empty Idempotency-Key", "POST", "/runs", json_h | {"Idempotency-Key": ""}, run),
        ("2000-char Idempotency-Key", "POST", "/runs", json_h | {"Idempotency-Key": "k" * 2000}, run),
        ("Idempotency-Key with spaces", "POST", "/runs", json_h | {"Idempotency-Key": "a b\tc"}, run),
        ("no token", "GET", "/runs", {}, b""),
        ("unknown token", "GET", "/runs", bearer("spk_" + "0" * 40), b""),
        ("10 kB token", "GET", "/runs", bearer("x" * 10_000), b""),
        ("Basic auth", "GET", "/runs", {"Authorization": "Basic YTpi"}, b""),
        ("wrong method", "PUT", "/runs", json_h, run),
        ("datastore without Content-Type", "POST", "/datastores?name=x", bearer(token), b"text"),
        (
            "datastore empty name",
            "POST",
            "/datastores?name=",
            bearer(token) | {"Content-Type": "text/plain"},
            b"text",
        ),
        ("tune session, traversal run id", "POST", "/tune-sessions", json_h, b'{"run_id": "../../etc"}'),
        ("1 MiB header", "GET", "/runs", bearer(token) | {"X-Pad": "p" * MB}, b""),
    ]
    bad: list[str] = []
    server_closed: list[str] = []
    statuses = []
    with httpx.Client(timeout=120) as client:
        for name, method, path, headers, body in cases:
            try:
                r = client.request(method, t.api(path), headers=headers, content=body or None)
            except httpx.HTTPError as exc:
                if name in SERVER_LEVEL:
                    server_closed.append(name)
                else:
                    bad.append(f"{name}: {type(exc).__name__}")
                continue
            statuses.append(r.status_code)
            # The HTTP server refuses what never reaches the app in its own words.
            if not (400 <= r.status_code < 500 and (is_problem(r) or name in SERVER_LEVEL)):
                bad.append(f"{name}: {r.status_code} {r.headers.get('content-type')}")
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    closed = f"closed by the HTTP server: {server_closed}; " if server_closed else ""
    observed = f"{len(cases)} requests, statuses {counts}; {closed}" + (
        f"not a 4xx problem: {bad}" if bad else "every one a 4xx problem+json"
    )
    return (observed, not bad)


# --- the suite -------------------------------------------------------------------------


# Issue 41's findings, then the earlier round's; PostgreSQL's outage last: it stops the
# watcher (`specops up` starts both again).
ORDER = [
    "engine-body-limit", "engine-tenant-claim", "metrics-tenant-labels", "audit-tail-delete",
    "audit-rewrite", "intake-dedup", "storage-quota", "model-ref-probe", "dlq-show-nested",
    "console-sign-out", "budgets", "forged-events", "anonymous-nats", "cross-tenant-reads", "poison",
    "api-abuse", "postgres-recovery",
]  # fmt: skip


def play(target: Target, attack: Attack) -> Outcome:
    log(f"=== {attack.name}")
    begin = time.monotonic()
    try:
        observed, held = attack.run(target)
    except Exception as exc:  # noqa: BLE001 - one attack's failure is its row; the next runs
        traceback.print_exc()
        observed, held = f"the attack failed: {type(exc).__name__}: {short(str(exc), 300)}", False
    outcome = Outcome(attack.name, attack.expected, observed, held, round(time.monotonic() - begin, 1))
    log(f"{attack.name}: {'held' if held else 'NOT HELD'}: {observed}")
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/attack.json"))
    parser.add_argument("--page", type=Path, default=Path("docs/results/attack.md"))
    parser.add_argument("--postgres-outage-s", type=float, default=OUTAGE_S)
    parser.add_argument("--engine-args", default="", help="more options of `specops serve engine`")
    parser.add_argument("--only", nargs="*", choices=ORDER, help="attack names to play (default: all)")
    args = parser.parse_args()
    # A stopped suite still takes its stack and engine down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [ATTACKS[name] for name in ORDER if not args.only or name in args.only]
    outcomes: list[Outcome] = []
    begin = time.monotonic()
    keep = os.environ.get("SPECOPS_ATTACK_KEEP") == "1"
    with (
        stack(dict.fromkeys(SERVICES, 1), prefix="attack", keep=keep) as running,
        engine(running.root, shlex.split(args.engine_args)) as (url, pid),
    ):
        target = Target(running, url, pid, args.postgres_outage_s)
        for attack in chosen:
            outcomes.append(play(target, attack))
            write(args, outcomes, time.monotonic() - begin)
    failed = [o.name for o in outcomes if not o.held]
    log(f"done in {time.monotonic() - begin:.0f} s; " + (f"NOT held: {failed}" if failed else "all held"))
    return 1 if failed else 0


def write(args: argparse.Namespace, outcomes: list[Outcome], elapsed_s: float) -> None:
    """The rows, each with when and how it was produced, and the results page made from them."""
    produced = {
        "date": dt.date.today().isoformat(),
        "command": "make attack",
        "host": f"{platform.machine()}, {os.cpu_count()} cpus",
        "suite_elapsed_s": round(elapsed_s, 1),
    }
    rows = [asdict(o) | produced for o in outcomes]
    if args.only and args.out.exists():
        # A rerun of some attacks replaces their rows and keeps the others'.
        replaced = {row["name"] for row in rows}
        rows = [row for row in json.loads(args.out.read_text()) if row["name"] not in replaced] + rows
        rows.sort(key=lambda row: ORDER.index(row["name"]) if row["name"] in ORDER else len(ORDER))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page(rows, args.out))


def page(rows: list[dict[str, Any]], out: Path) -> str:
    """docs/results/attack.md: the rows as a table, with when, where and how they were measured."""
    dates = ", ".join(sorted({row["date"] for row in rows}))
    host = rows[0]["host"] if rows else "-"
    held = sum(row["held"] for row in rows)
    lines = [
        "# Attacks",
        "",
        f"**Measured:** {dates}, {host}.  ",
        f"**Reproduce:** `make attack` (`bench/attack.py --out {out}`); one attack alone, keeping the "
        "other rows: `bench/attack.py --only NAME`  ",
        f"**Results:** `{out}` (in the repository).",
        "",
        "Generated by `bench/attack.py` from its results; do not edit by hand.",
        "",
        "One `specops up` on a scratch state dir (real NATS, PostgreSQL, the services as processes, "
        "the 135M model) and one `specops serve engine` (suffix, drift control on, every tenant in the "
        "`shared` tier); each attack uses fresh tenants of its own. Issue 41's findings come first, "
        "PostgreSQL's outage last (it stops the watcher), the earlier round's attacks between.",
        "",
        f"{held} of {len(rows)} held.",
        "",
        "| attack | expected | observed | held |",
        "|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"`{row['name']}`", row["expected"], row["observed"], "yes" if row["held"] else "**no**"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
