"""Idempotent POSTs (draft-ietf-httpapi-idempotency-key-header): the key, the replay decision,
the stored responses (`idempotency_keys`, 003_gateway.sql) and `keyed`, which every resource's POSTs
run their work under. The only module that touches `idempotency_keys`, so its SQL lives here too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import Header, Request
from fastapi.responses import JSONResponse
from psycopg.types.json import Jsonb

from specops_services.gateway.http import refusals
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import problem
from specplatform.db import Connection, Pool, tenant_transaction

# --- the key and the replay decision ---------------------------------------------------------

IDEMPOTENCY_TTL = timedelta(hours=24)
IDEMPOTENCY_KEY_MAX = 255

# RFC 8941 sf-string: printable ASCII, with `"` and `\` escaped by a backslash.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')

# The seed's own curl example sends an unquoted uuid, so a bare token is accepted too.
_BARE_KEY = re.compile(r"[\x21-\x7e]+")


def parse_idempotency_key(raw: str) -> str:
    """The key of an `Idempotency-Key` header; ValueError says why it is not one."""
    value = raw.strip()
    quoted = _SF_STRING.fullmatch(value)
    if quoted:
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif _BARE_KEY.fullmatch(value) and '"' not in value:
        key = value
    else:
        raise ValueError('Idempotency-Key must be a structured-field string, e.g. "8e03978e-..."')
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        raise ValueError(f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} characters")
    return key


def hash_request(method: str, path: str, body: bytes) -> str:
    """sha256 of what the request asks for; JSON bodies are canonicalised first.

    Canonical JSON means a client that re-serialises the same body with other
    whitespace or key order still gets its replay instead of a 422.
    """
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, UnicodeDecodeError):
        canonical = body
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), canonical):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Reply:
    """What a POST answers: status, JSON body and extra headers (e.g. Location)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A completed POST kept for replay under its (tenant, key)."""

    request_hash: str
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def idempotency_decision(
    stored: StoredResponse | None, request_hash: str
) -> Literal["proceed", "replay", "mismatch"]:
    """What to do with a keyed POST once no other request holds the key (that is a 409)."""
    if stored is None:
        return "proceed"
    return "replay" if stored.request_hash == request_hash else "mismatch"


def should_store(status: int) -> bool:
    """Only successes are kept: an error leaves the key free for a corrected retry."""
    return 200 <= status < 300


# --- idempotency_keys ------------------------------------------------------------------------

KEY_PURGER = "specops_key_purger"  # every tenant's expired idempotency keys, to delete


def _lock_id(tenant_id: str, key: str) -> int:
    digest = hashlib.sha256(f"idempotency\0{tenant_id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def try_lock_key(conn: Connection, tenant_id: str, key: str) -> bool:
    """Hold (tenant, key) until the transaction ends; False if another request holds it.

    The lock is the in-flight marker: it is released by commit, rollback or a dropped
    connection, so a crashed request never leaves a key stuck in flight.
    """
    cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS locked", (_lock_id(tenant_id, key),))
    row = await cur.fetchone()
    return bool(row and row["locked"])


async def stored_response(conn: Connection, tenant_id: str, key: str) -> StoredResponse | None:
    cur = await conn.execute(
        """SELECT request_hash, response_status, response_body, response_headers FROM idempotency_keys
           WHERE tenant_id = %s AND key = %s AND status = 'completed' AND expires_at > now()""",
        (tenant_id, key),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return StoredResponse(
        request_hash=row["request_hash"],
        status=row["response_status"],
        body=row["response_body"],
        headers=row["response_headers"] or {},
    )


async def store_response(
    conn: Connection, tenant_id: str, key: str, response: StoredResponse, ttl: timedelta
) -> None:
    """Keep a completed response for replay; replaces an expired row under the same key."""
    await conn.execute(
        """INSERT INTO idempotency_keys
               (tenant_id, key, request_hash, status, response_status, response_body, response_headers,
                expires_at)
           VALUES (%s, %s, %s, 'completed', %s, %s, %s, now() + %s)
           ON CONFLICT (tenant_id, key) DO UPDATE SET
               request_hash = EXCLUDED.request_hash, status = 'completed',
               response_status = EXCLUDED.response_status, response_body = EXCLUDED.response_body,
               response_headers = EXCLUDED.response_headers, created_at = now(),
               expires_at = EXCLUDED.expires_at""",
        (
            tenant_id,
            key,
            response.request_hash,
            response.status,
            Jsonb(response.body),
            Jsonb(response.headers),
            ttl,
        ),
    )


async def purge_expired_keys(conn: Connection) -> int:
    """Delete every tenant's expired idempotency keys, as KEY_PURGER (which sees no live one)."""
    cur = await conn.execute("DELETE FROM idempotency_keys WHERE expires_at <= now()")
    return cur.rowcount


# --- keyed: a POST's work under its key ---------------------------------------------------------

Work = Callable[[Connection], Awaitable[Reply]]
# The problem of a request whose Idempotency-Key another request holds right now.
KEY_IN_FLIGHT = "urn:specops:problem:idempotency-key-in-flight"


async def keyed(
    pool: Pool,
    principal: Principal,
    key: str | None,
    request_hash: str,
    work: Work,
    *,
    ttl: timedelta = IDEMPOTENCY_TTL,
) -> Reply:
    """Run `work` in one tenant transaction, under the request's Idempotency-Key if it sent one.

    The key's advisory lock, the replay lookup, the work and the stored response share
    that transaction, so a response is stored exactly when the work's writes commit;
    it is replayed for `ttl` (a replay is answered before any check of `work`). A security
    refusal `work` raises is recorded once the transaction has rolled back
    (`refusals.recording`).
    """
    tenant = principal.tenant_id
    async with (
        refusals.recording(pool, principal),
        pool.connection() as conn,
        tenant_transaction(conn, tenant),
    ):
        if key is not None:
            if not await try_lock_key(conn, tenant, key):
                raise problem(
                    409,
                    "a request with this Idempotency-Key is still in progress; retry once it has finished",
                    type=KEY_IN_FLIGHT,
                )
            stored = await stored_response(conn, tenant, key)
            decision = idempotency_decision(stored, request_hash)
            if decision == "mismatch":
                raise problem(
                    422,
                    "this Idempotency-Key was already used with a different request; use a new key",
                    type="urn:specops:problem:idempotency-key-reused",
                )
            if decision == "replay" and stored is not None:
                return Reply(stored.status, stored.body, stored.headers | {"Idempotent-Replayed": "true"})
        reply = await work(conn)
        if key is not None and should_store(reply.status):
            response = StoredResponse(request_hash, reply.status, reply.body, reply.headers)
            await store_response(conn, tenant, key, response, ttl)
        return reply


# --- the HTTP side: the header, the request's hash, the reply -----------------------------------

IDEMPOTENCY_DOC = (
    "Optional (draft-ietf-httpapi-idempotency-key-header). A unique key per logical request, as a "
    'structured-field string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`; a bare token is accepted too). '
    "A retry with the same key and body returns the stored response (with `Idempotent-Replayed: true`) "
    "instead of acting twice; the same key with another body is a 422, and a retry while the first "
    "request is still being processed is a 409. Keys are scoped to the tenant and expire 24 hours after "
    "the response was stored; only successful (2xx) responses are stored, so a request that failed may "
    "be retried with the same key. Without the header the POST is accepted but not protected against "
    "duplicates."
)


IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", description=IDEMPOTENCY_DOC)]


def parse_key(raw: str | None) -> str | None:
    """The Idempotency-Key header's key (None without one); 400 if it is malformed."""
    if raw is None:
        return None
    try:
        return parse_idempotency_key(raw)
    except ValueError as exc:
        raise problem(400, str(exc)) from None


async def request_hash(request: Request) -> str:
    """What an idempotent replay must match: method, path and body."""
    return hash_request(request.method, request.url.path, await request.body())


def json_reply(reply: Reply) -> JSONResponse:
    """A handler's reply (status, body, headers) as the response."""
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
