"""Whether a request may speak for the tenant it names: pure, no I/O (the app reads the
headers, the body and the clock, and turns a refusal into an OpenAI error).

A tenant claim (``X-Specops-Tenant``) is taken when a trusted proxy signed it with the key the
server shares with it (specplatform.tenant_signature: HMAC-SHA256 over the timestamp, method,
path, tenant, workload and the body's hash):

- with a key, every claim must be signed, in every tier;
- without a key, a claim is taken only for a tenant of the single-tenant tier, where tenants
  share the pools anyway and the tenant names a drift key, nothing more; a claim of a
  shared or multi-tenant tier's tenant cannot be verified, so it is refused;
- no claim at all is the default tenant, under the default policy.

A claim without a signature is a 401; a signature that is malformed, wrong, for another
body or endpoint, or older (or newer) than ``skew_s`` is a 403.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from specops_schemas.security import SecurityTier
from specplatform.tenant_signature import SIGNATURE_HEADER, TENANT_HEADER, signature

# How far a signature's timestamp may be from the server's clock: clocks of the proxy and
# the engine drift by seconds, not minutes; a captured signature is good for this long.
DEFAULT_SKEW_S = 300
_SIGNATURE = re.compile(r"t=(\d{1,12}),v1=([0-9a-f]{64})")


class TenantRefused(Exception):
    """The request may not speak for the tenant it names: 401 (no signature) or 403 (a bad one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request says and what its signature covers."""

    tenant: str
    workload: str  # "" when the request names none
    signature: str | None  # the X-Specops-Signature header
    method: str
    path: str
    body: bytes


@dataclass(frozen=True, slots=True)
class TenantVerifier:
    key: bytes | None = None  # the key shared with the trusted proxy; None: no signatures
    skew_s: int = DEFAULT_SKEW_S

    def check(self, claim: Claim, tier: SecurityTier, now: float) -> None:
        """Nothing when ``claim`` is taken; TenantRefused saying why otherwise. ``tier``: the
        claimed tenant's tier, ``now``: the server's unix time."""
        if self.key is None:
            if tier == SecurityTier.SINGLE_TENANT:
                return
            if claim.signature is None:
                raise TenantRefused(
                    401,
                    f"tenant {claim.tenant!r} is in the {tier} tier: its {TENANT_HEADER} claim must be "
                    f"signed by the trusted proxy ({SIGNATURE_HEADER}), and this server has no tenant key",
                )
            raise TenantRefused(403, f"this server has no tenant key to verify {SIGNATURE_HEADER} with")
        if claim.signature is None:
            raise TenantRefused(
                401, f"a {TENANT_HEADER} claim must be signed by the trusted proxy ({SIGNATURE_HEADER})"
            )
        parsed = _SIGNATURE.fullmatch(claim.signature.strip())
        if parsed is None:
            raise TenantRefused(403, f"{SIGNATURE_HEADER} must read t=<unix seconds>,v1=<64 hex digits>")
        timestamp, mac = int(parsed[1]), parsed[2]
        if abs(now - timestamp) > self.skew_s:
            raise TenantRefused(
                403, f"{SIGNATURE_HEADER} is {now - timestamp:.0f} s old, over the {self.skew_s} s allowed"
            )
        expected = signature(
            self.key, timestamp, claim.method, claim.path, claim.tenant, claim.workload, claim.body
        )
        if not hmac.compare_digest(expected, mac):
            raise TenantRefused(
                403, f"{SIGNATURE_HEADER} does not match this tenant, workload, endpoint and body"
            )
