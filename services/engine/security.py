"""The engine's read model of the tenants' security policies (issue 20), and what it decides
for a request: its draft pool's scope (F-S1) and its release pace (F-S2).

Pure, no I/O: the server builds it from its flags (the default policy of every tenant) and a
`--security-policies` file (a JSON list of `SecurityPolicy`), and the policy feed
(security_events.py) applies each `PolicyChanged` event the security service publishes. A
tenant's newer policy (higher version) replaces the older; an older or equal one is ignored,
so a replayed event changes nothing.

- **Draft pool scope** (F-S1): one scope for every tenant of the single-tenant tier, the
  tenant's own where its policy keeps caches per tenant (shared, isolated tiers): a tenant
  of those tiers neither reads nor feeds another's entries.
- **Pace** (F-S2): the tenant's jitter settings; seconds between releases, or None.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from specops_schemas.security import JitterMode, PolicySettings, SecurityPolicy
from specplatform.tenant_signature import UNCLAIMED_TENANT

# The draft pool scope of the single-tenant tier; a tenant id never is "*" (a subject token).
GLOBAL_SCOPE = "*"

_POLICY_LIST = TypeAdapter(list[SecurityPolicy])


class SecurityPolicies:
    def __init__(
        self, default: PolicySettings | None = None, policies: Iterable[SecurityPolicy] = ()
    ) -> None:
        self.default = default or PolicySettings()
        self.tenants: dict[str, SecurityPolicy] = {}
        for p in policies:
            self.apply(p)

    def policy(self, tenant: str) -> PolicySettings:
        return self.tenants.get(tenant, self.default)

    def apply(self, policy: SecurityPolicy) -> bool:
        """Take a tenant's policy unless an equal or newer version is already held; True if taken.
        A policy for the name of unclaimed requests is never taken: it would be every unsigned
        request's policy."""
        if policy.tenant_id == UNCLAIMED_TENANT:
            return False
        held = self.tenants.get(policy.tenant_id)
        if held is not None and held.version >= policy.version:
            return False
        self.tenants[policy.tenant_id] = policy
        return True

    def draft_scope(self, tenant: str) -> str:
        return tenant if self.policy(tenant).per_tenant_caches else GLOBAL_SCOPE

    def pace_s(self, tenant: str) -> float | None:
        jitter = self.policy(tenant).jitter
        return jitter.interval_ms / 1000.0 if jitter.mode == JitterMode.PACE else None


def load_policies(path: Path) -> list[SecurityPolicy]:
    """The policies of a `--security-policies` file; ValueError saying what is wrong."""
    try:
        return _POLICY_LIST.validate_python(json.loads(path.read_text()))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path}: not a list of security policies: {where}: {first['msg']}") from None
