"""Attacks on the audit log and on NATS: tail deletion and rewrite, intake dedup, forged events,
anonymous connections, poison and a dead letter too deep to print."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import httpx
import nats
import nkeys
import psycopg
from attack_kit import (
    RUN_BODY,
    Observed,
    Target,
    attack,
    bearer,
    last_line,
    short,
)
from live_stack import (
    Stack,
    poison_messages,
    publish_as_admin,
    stream_messages,
    wait_parked,
)

from specbus.publish import MSG_ID
from specbus.subjects import intake_answer_subject, intake_subject
from specops.runtime.nats_auth import Keys
from specops.runtime.supervisor import add_tenant
from specops.runtime.topology import service_users

ANSWER_TIMEOUT_S = 90.0

# The tests' own tamperer: the round rewrote the audit log as it does.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from audit_tamper import rewrite_with_recomputed_chain  # noqa: E402

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
    named = bool(marks) and all(int(m) in _named_missing(out) for m in marks)
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


def _named_missing(out: str) -> set[int]:
    """The stream sequences `verify --against-stream` names as having no row (`5..6, 9`)."""
    found = re.search(r"misses stream messages ([\d., ]+)", out)
    named: set[int] = set()
    for part in found.group(1).split(",") if found else []:
        low, _, high = part.strip().strip(".").partition("..")
        if low.isdigit():
            named.update(range(int(low), int(high or low) + 1))
    return named
