"""The engine server's read model of the tenants' security policies (services/engine/security.py)
and the flags that set its default (`specops serve engine --jitter ... --security-policies`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from speccore.errors import SpecError
from specops.commands import serve_engine
from specops_schemas.catalog import Role
from specops_schemas.security import JitterMode, JitterSettings, PolicySettings, SecurityPolicy, SecurityTier
from specops_services.engine.security import GLOBAL_SCOPE, SecurityPolicies, load_policies
from specops_services.gateway.http.tokens import issue_token
from specplatform.tenant_signature import UNCLAIMED_TENANT


def policy(tenant: str, version: int, **settings: object) -> SecurityPolicy:
    return SecurityPolicy(tenant_id=tenant, version=version, **settings)  # type: ignore[arg-type]


def test_a_tenant_without_a_policy_of_its_own_gets_the_default() -> None:
    paced = PolicySettings(jitter=JitterSettings(mode=JitterMode.PACE, interval_ms=25))
    policies = SecurityPolicies(paced, [policy("acme", 1, tier=SecurityTier.SHARED)])
    assert policies.pace_s("other") == pytest.approx(0.025)
    assert policies.draft_scope("other") == GLOBAL_SCOPE  # single_tenant: one pool for all
    assert policies.pace_s("acme") is None  # its own policy: no jitter
    assert policies.draft_scope("acme") == "acme"  # shared tier: caches per tenant


def test_only_a_newer_version_replaces_a_tenants_policy() -> None:
    policies = SecurityPolicies()
    assert policies.apply(policy("acme", 2, tier=SecurityTier.SHARED))
    assert not policies.apply(policy("acme", 1))  # an older event, replayed
    assert not policies.apply(policy("acme", 2))
    assert policies.policy("acme").tier == SecurityTier.SHARED
    assert policies.apply(
        policy("acme", 3, tier=SecurityTier.MULTI_TENANT_ISOLATED, speculation_opt_out=True)
    )
    assert policies.policy("acme").speculation_opt_out


def test_no_policy_is_taken_for_the_name_of_requests_that_name_no_tenant() -> None:
    # Else every unsigned request would read that tenant's pool under its policy.
    policies = SecurityPolicies()
    assert not policies.apply(policy(UNCLAIMED_TENANT, 1, tier=SecurityTier.SHARED))
    assert policies.draft_scope(UNCLAIMED_TENANT) == GLOBAL_SCOPE


def test_the_platform_refuses_a_tenant_by_that_name() -> None:
    # Refused before any database is reached, so no address is needed.
    with pytest.raises(ValueError, match="reserved"):
        asyncio.run(issue_token("postgresql:///nowhere", tenant_id=UNCLAIMED_TENANT, role=Role.DEVELOPER))


def test_a_policies_file_is_a_list_of_policies(tmp_path: Path) -> None:
    path = tmp_path / "policies.json"
    path.write_text(json.dumps([policy("acme", 1, tier="shared").model_dump(mode="json")]))
    assert [p.tenant_id for p in load_policies(path)] == ["acme"]
    path.write_text(json.dumps([{"tenant_id": "acme", "version": 1, "tier": "gold"}]))
    with pytest.raises(ValueError, match="0.tier"):
        load_policies(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_policies(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_policies(tmp_path / "missing.json")


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_engine.add_engine_options(parser)
    return parser.parse_args(list(flags))


def test_the_flags_set_every_tenants_default_policy(tmp_path: Path) -> None:
    default, own = serve_engine.security_policies(
        _args("--jitter", "pace", "--jitter-interval-ms", "30", "--security-tier", "shared")
    )
    assert default.jitter == JitterSettings(mode=JitterMode.PACE, interval_ms=30)
    assert default.per_tenant_caches and own == []
    default, _ = serve_engine.security_policies(_args())
    assert default == PolicySettings()
    with pytest.raises(SpecError, match="--jitter pace"):
        serve_engine.security_policies(_args("--jitter-interval-ms", "30"))
    with pytest.raises(SpecError, match="interval_ms"):
        serve_engine.security_policies(_args("--jitter", "pace", "--jitter-interval-ms", "0"))
    with pytest.raises(SpecError, match="cannot read"):
        serve_engine.security_policies(_args("--security-policies", str(tmp_path / "none.json")))
