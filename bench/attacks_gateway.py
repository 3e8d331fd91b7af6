"""Attacks on the HTTP gateway: storage quota, model_ref probing, PostgreSQL's return, console
sessions, budgets, cross-tenant reads and malformed requests."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from attack_kit import (
    MB,
    RUN_BODY,
    Observed,
    Target,
    attack,
    bearer,
    is_problem,
    short,
)
from live_stack import (
    TARGET,
    log,
    stop_watcher,
)

from specops.runtime import postgres_server
from specops.runtime.state import StateDir
from specops.runtime.supervisor import up
from specops_schemas.catalog import Role
from specops_schemas.security import PolicySettings

# The round's outage: long enough for the pool's reconnect backoff to grow (45 s of 503s after
# it on the tree it found; 3.7 s after a 60 s outage).
OUTAGE_S = 180.0

# What the storage quota is measured against when the policy has no such field (the round's
# upload that met no limit).
FALLBACK_QUOTA_BYTES = 198 * MB

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
