"""A trusted proxy's signature of the tenant it vouches for, on a request to the engine server.

The engine serves whoever reaches it; the tenant a request names (``X-Specops-Tenant``) picks
its draft pool and prefix cache scope, its pace and its opt-out, so a bare claim would let
anyone read another tenant's pool. The proxy in front (the one that authenticated the caller)
signs its claim with a key it shares with the engine:

    X-Specops-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, message)>

where the message is, one field per line: the timestamp, the method, the path, the tenant, the
workload (empty when not sent) and the SHA-256 (hex) of the body. The body's hash binds the
signature to this prompt, the method and path to this endpoint (a body may carry both
``prompt`` and ``messages``), the timestamp bounds how long a captured signature is good for.
Fields are joined by newlines, which none of them can hold, so no two claims share a message.

This module builds the header (for proxies, clients and tests: `signed_headers`,
`TenantSigner` for httpx) and the message the engine checks it against.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Generator

import httpx

TENANT_HEADER = "X-Specops-Tenant"
WORKLOAD_HEADER = "X-Specops-Workload"
SIGNATURE_HEADER = "X-Specops-Signature"
KEY_ENV = "SPECOPS_ENGINE_TENANT_KEY"
# What the engine calls a request that names no tenant. No tenant may have this id (the
# gateway refuses to create it, the engine a policy for it): else an unsigned request would
# speak for that tenant, its pool and its policy.
UNCLAIMED_TENANT = "default"
# A shared key shorter than this is guessable offline from one captured signature.
MIN_KEY_BYTES = 32


def message(timestamp: int, method: str, path: str, tenant: str, workload: str, body: bytes) -> bytes:
    """What the signature's HMAC is over (see the module's docstring)."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join((str(timestamp), method.upper(), path, tenant, workload, digest)).encode()


def signature(
    key: bytes, timestamp: int, method: str, path: str, tenant: str, workload: str, body: bytes
) -> str:
    """The hex HMAC-SHA256 of the message with ``key``."""
    return hmac.new(key, message(timestamp, method, path, tenant, workload, body), hashlib.sha256).hexdigest()


def signed_headers(
    key: bytes,
    tenant: str,
    body: bytes,
    *,
    workload: str | None = None,
    method: str = "POST",
    path: str = "/v1/completions",
    now: float | None = None,
) -> dict[str, str]:
    """The tenant (and workload) headers of a request with their signature."""
    t = int(time.time() if now is None else now)
    headers = {TENANT_HEADER: tenant}
    if workload:
        headers[WORKLOAD_HEADER] = workload
    mac = signature(key, t, method, path, tenant, workload or "", body)
    headers[SIGNATURE_HEADER] = f"t={t},v1={mac}"
    return headers


class TenantSigner(httpx.Auth):
    """httpx auth that signs every request's tenant claim over its body, so that an httpx or
    `openai` client (``http_client=httpx.Client(auth=...)``) speaks for ``tenant``."""

    requires_request_body = True

    def __init__(self, key: bytes, tenant: str, workload: str | None = None) -> None:
        self.key = key
        self.tenant = tenant
        self.workload = workload

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            signed_headers(
                self.key,
                self.tenant,
                request.content,
                workload=self.workload,
                method=request.method,
                path=request.url.path,
            )
        )
        yield request
