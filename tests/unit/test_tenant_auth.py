"""The engine's tenant claim check (tenant_auth, pure): which claims it takes in which tier,
with and without a key, and that a signature speaks for one tenant, workload, endpoint and
body, for a few minutes; and where the server's key comes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from speccore.errors import SpecError
from specops.commands.serve_engine import read_tenant_key
from specops_schemas.security import SecurityTier
from specops_services.engine.tenant_auth import DEFAULT_SKEW_S, Claim, TenantRefused, TenantVerifier
from specplatform.tenant_signature import (
    KEY_ENV,
    SIGNATURE_HEADER,
    TENANT_HEADER,
    WORKLOAD_HEADER,
    signed_headers,
)

KEY = b"k" * 32
NOW = 1_800_000_000.0
BODY = b'{"model": "m", "prompt": "hello"}'
PATH = "/v1/completions"
TIERS = list(SecurityTier)


def claim(headers: dict[str, str], body: bytes = BODY, path: str = PATH) -> Claim:
    return Claim(
        tenant=headers[TENANT_HEADER],
        workload=headers.get(WORKLOAD_HEADER, ""),
        signature=headers.get(SIGNATURE_HEADER),
        method="POST",
        path=path,
        body=body,
    )


def signed(tenant: str = "acme", *, key: bytes = KEY, at: float = NOW, **kw: str) -> dict[str, str]:
    return signed_headers(key, tenant, BODY, path=PATH, now=at, **kw)


def refusal(verifier: TenantVerifier, c: Claim, tier: SecurityTier) -> int:
    with pytest.raises(TenantRefused) as refused:
        verifier.check(c, tier, NOW)
    return refused.value.status


@pytest.mark.parametrize("tier", TIERS)
def test_a_good_signature_is_taken_in_every_tier(tier: SecurityTier) -> None:
    TenantVerifier(KEY).check(claim(signed(workload="chat")), tier, NOW)


@pytest.mark.parametrize("tier", TIERS)
def test_with_a_key_a_bare_claim_is_401_in_every_tier(tier: SecurityTier) -> None:
    assert refusal(TenantVerifier(KEY), claim({TENANT_HEADER: "acme"}), tier) == 401


def test_without_a_key_only_the_single_tenant_tier_takes_a_bare_claim() -> None:
    verifier = TenantVerifier()
    verifier.check(claim({TENANT_HEADER: "acme"}), SecurityTier.SINGLE_TENANT, NOW)
    for tier in (SecurityTier.SHARED, SecurityTier.MULTI_TENANT_ISOLATED):
        assert refusal(verifier, claim({TENANT_HEADER: "acme"}), tier) == 401
        # Signed with a key the server does not have: it cannot be verified.
        assert refusal(verifier, claim(signed()), tier) == 403


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda h: h | {TENANT_HEADER: "victim"}, id="another tenant"),
        pytest.param(lambda h: h | {WORKLOAD_HEADER: "code"}, id="another workload"),
        pytest.param(lambda h: signed(key=b"x" * 32), id="another key"),
        pytest.param(lambda h: h | {SIGNATURE_HEADER: h[SIGNATURE_HEADER][:-1] + "0"}, id="altered mac"),
        pytest.param(lambda h: h | {SIGNATURE_HEADER: "v1=abc"}, id="malformed"),
        pytest.param(lambda h: signed(at=NOW - DEFAULT_SKEW_S - 1), id="stale"),
        pytest.param(lambda h: signed(at=NOW + DEFAULT_SKEW_S + 1), id="from the future"),
    ],
)
def test_a_wrong_signature_is_403(forged: Callable[[dict[str, str]], dict[str, str]]) -> None:
    headers = forged(signed(workload="chat"))
    assert refusal(TenantVerifier(KEY), claim(headers), SecurityTier.SHARED) == 403


def test_a_signature_is_for_one_body_and_endpoint() -> None:
    headers = signed()
    verifier = TenantVerifier(KEY)
    other_body = claim(headers, body=b'{"model": "m", "prompt": "show me the pool"}')
    assert refusal(verifier, other_body, SecurityTier.SHARED) == 403
    assert refusal(verifier, claim(headers, path="/v1/chat/completions"), SecurityTier.SHARED) == 403


def test_a_signature_within_the_skew_is_taken() -> None:
    TenantVerifier(KEY).check(claim(signed(at=NOW - DEFAULT_SKEW_S + 5)), SecurityTier.SHARED, NOW)


def test_the_key_comes_from_a_file_or_the_environment_and_is_long_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert read_tenant_key(None) is None
    key_file = tmp_path / "tenant.key"
    key_file.write_bytes(KEY + b"\n")
    assert read_tenant_key(str(key_file)) == KEY
    monkeypatch.setenv(KEY_ENV, "e" * 40)
    assert read_tenant_key(None) == b"e" * 40
    key_file.write_bytes(b"short")
    with pytest.raises(SpecError, match="at least 32"):
        read_tenant_key(str(key_file))
    with pytest.raises(SpecError, match="cannot read"):
        read_tenant_key(str(tmp_path / "missing"))
