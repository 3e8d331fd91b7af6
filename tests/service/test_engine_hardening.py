"""Issue 41's attacks on `specops serve engine` (its own process, smollm2 with n-gram, the
cross-request draft pool and drift control, a tenant key shared with a trusted proxy):

- a 20 MB body is a 413 in OpenAI's shape within 3 s, declared or chunked, the server's RSS
  does not grow by 100 MB, and /health answers while it arrives; a prompt longer than the
  context could hold is refused without tokenizing it, and /health answers while a long
  legal body is tokenized;
- a tenant claim is taken only with the proxy's signature: bare 401, wrong, stale or for
  another body 403, in OpenAI's shape; a signed claim drafts from its own tenant's pool;
- without a key, a claim of the single-tenant tier is served as before, a shared tier's is not;
- /metrics names no tenant, and its workload label takes the known workloads and `other`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import psutil
import pytest
from fixtures.engine import EngineProcess, engine_server

from speccatalog.workloads import WORKLOADS
from specops_schemas.security import SecurityPolicy, SecurityTier
from specops_services.engine.logic import prompt_chars_limit
from specplatform.tenant_signature import (
    SIGNATURE_HEADER,
    TENANT_HEADER,
    WORKLOAD_HEADER,
    TenantSigner,
    signed_headers,
)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
KEY = b"engine-hardening-test-key-0123456789abcdef"
TWENTY_MB = 20 * 1000 * 1000
MAX_TOKENS = 16
TEXT = "List the planets of the solar system, then list them again:"
POLICIES = [
    SecurityPolicy(tenant_id="victim", version=1, tier=SecurityTier.SHARED),
    SecurityPolicy(tenant_id="attacker", version=1, tier=SecurityTier.SHARED),
]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    tmp = tmp_path_factory.mktemp("engine")
    policies = tmp / "policies.json"
    policies.write_text(json.dumps([p.model_dump(mode="json") for p in POLICIES]))
    key = tmp / "tenant.key"
    key.write_bytes(KEY + b"\n")
    args = ["--model", MODEL, "--method", "ngram", "--draft-pool"]
    args += ["--security-policies", str(policies), "--tenant-key-file", str(key)]
    with engine_server(args, tmp / "engine.log") as server:
        yield server


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """No tenant key, drift control on (its metrics are the ones labelled by workload)."""
    tmp = tmp_path_factory.mktemp("keyless")
    policies = tmp / "policies.json"
    policies.write_text(json.dumps([p.model_dump(mode="json") for p in POLICIES]))
    args = ["--model", MODEL, "--method", "eagle", "--head", "builtin:eagle", "--fallback", "ngram"]
    args += ["--security-policies", str(policies)]
    with engine_server(args, tmp / "engine.log") as server:
        yield server


def _body(prompt: str | list[str] = TEXT) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()


def _assert_openai_error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def _rss(engine: EngineProcess) -> int:
    return psutil.Process(engine.proc.pid).memory_info().rss


def _health_while(engine: EngineProcess, busy: threading.Event) -> list[float]:
    """Seconds each /health took while ``busy`` was set (polled until it clears)."""
    took = []
    with httpx.Client(base_url=engine.url, timeout=30) as c:
        while busy.is_set():
            sent = time.monotonic()
            assert c.get("/health").status_code == 200
            took.append(time.monotonic() - sent)
            time.sleep(0.05)
    return took


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"specops:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_20_mb_body_is_413_at_once_declared_or_chunked(engine: EngineProcess) -> None:
    with httpx.Client(base_url=engine.url, timeout=60) as c:
        warm = c.post("/v1/completions", content=_body(), headers=JSON)
        assert warm.status_code == 200, warm.text
        before = _rss(engine)
        huge = _body("x" * TWENTY_MB)

        sent = time.monotonic()
        declared = c.post("/v1/completions", content=huge, headers=JSON)
        declared_s = time.monotonic() - sent

        busy = threading.Event()

        def chunks() -> Iterator[bytes]:
            # Slowly enough that /health is asked while the body is still arriving.
            for start in range(0, len(huge), 1 << 20):
                yield huge[start : start + (1 << 20)]
                time.sleep(0.02)
            busy.clear()

        busy.set()
        with ThreadPoolExecutor(1) as pool:
            health = pool.submit(_health_while, engine, busy)
            sent = time.monotonic()
            chunked = c.post("/v1/completions", content=chunks(), headers=JSON)
            chunked_s = time.monotonic() - sent
            busy.clear()
            health_s = health.result()
    for response, took in ((declared, declared_s), (chunked, chunked_s)):
        error = _assert_openai_error(response, 413)
        assert "4194304 bytes" in str(error["message"])
        assert took < 3.0, f"refused after {took:.1f} s"
    assert health_s and max(health_s) < 1.0, health_s
    grew = _rss(engine) - before
    assert grew < 100 << 20, f"RSS grew by {grew >> 20} MiB"


def test_a_prompt_longer_than_the_context_could_hold_is_refused_untokenized(engine: EngineProcess) -> None:
    context = httpx.get(f"{engine.url}/v1/models").json()["data"][0]["max_model_len"]
    limit = prompt_chars_limit(context)
    sent = time.monotonic()
    response = httpx.post(f"{engine.url}/v1/completions", content=_body("y" * (limit + 1)), headers=JSON)
    error = _assert_openai_error(response, 400)
    assert f"at most {limit}" in str(error["message"]) and error["param"] == "prompt"
    assert time.monotonic() - sent < 3.0


def test_health_answers_while_a_long_legal_body_is_tokenized(engine: EngineProcess) -> None:
    context = httpx.get(f"{engine.url}/v1/models").json()["data"][0]["max_model_len"]
    # Prompts each just under the character bound, a body under the byte limit: all of it is
    # tokenized before the context refuses it.
    prompt = ("the quick brown fox jumps over the lazy dog " * (prompt_chars_limit(context) // 44))[:-1]
    body = _body([prompt] * ((4 << 20) // len(prompt) - 1))
    busy = threading.Event()
    busy.set()
    with ThreadPoolExecutor(1) as pool:
        health = pool.submit(_health_while, engine, busy)
        sent = time.monotonic()
        response = httpx.post(f"{engine.url}/v1/completions", content=body, headers=JSON, timeout=120)
        took = time.monotonic() - sent
        busy.clear()
        health_s = health.result()
    _assert_openai_error(response, 400)  # longer than the context, once tokenized
    # Health kept answering: no wait spanned much of the tokenizing (on the event loop one wait
    # spanned nearly all of it). A ratio, not a wall-clock bound: a loaded host once took 1.8 s.
    assert len(health_s) >= 2 and max(health_s) < took / 2, (took, health_s)


def _post(engine: EngineProcess, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{engine.url}/v1/completions", content=body, headers=JSON | headers, timeout=120)


def test_a_tenant_claim_needs_the_proxys_signature(engine: EngineProcess) -> None:
    body = _body()
    good = signed_headers(KEY, "victim", body)
    # Naming the victim, as the attack did.
    _assert_openai_error(_post(engine, body, {TENANT_HEADER: "victim"}), 401)
    wrong = signed_headers(b"not-the-proxys-key-0123456789abcdef", "victim", body)
    _assert_openai_error(_post(engine, body, wrong), 403)
    other_prompt = _body("Tell me what the victim asked.")
    _assert_openai_error(_post(engine, other_prompt, good), 403)  # replayed on another body
    stale = signed_headers(KEY, "victim", body, now=time.time() - 600)
    _assert_openai_error(_post(engine, body, stale), 403)
    forged = good | {SIGNATURE_HEADER: good[SIGNATURE_HEADER][:-4] + "beef"}
    _assert_openai_error(_post(engine, body, forged), 403)
    # With a key, even a tenant of the single-tenant tier must be signed.
    _assert_openai_error(_post(engine, body, {TENANT_HEADER: "someone"}), 401)
    # No claim at all: the default tenant.
    assert _post(engine, body, {}).status_code == 200


def test_a_signed_claim_drafts_from_its_own_tenants_pool(engine: EngineProcess) -> None:
    def complete(tenant: str) -> str:
        http = httpx.Client(auth=TenantSigner(KEY, tenant, "chat"), timeout=120)
        with openai.OpenAI(
            base_url=f"{engine.url}/v1", api_key="unused", max_retries=0, http_client=http
        ) as c:
            r = c.completions.create(model=MODEL, prompt=TEXT, max_tokens=MAX_TOKENS, temperature=0)
        return r.choices[0].text

    scopes = _metric(engine.url, "draft_pool_scopes")
    first = complete("victim")
    assert _metric(engine.url, "draft_pool_scopes") == scopes + 1  # the victim's own pool
    hits = _metric(engine.url, "draft_pool_hits_total")
    assert complete("attacker") == first
    assert _metric(engine.url, "draft_pool_hits_total") == hits  # none of the victim's entries
    assert complete("victim") == first
    assert _metric(engine.url, "draft_pool_hits_total") > hits  # its own entries


def test_without_a_key_only_single_tenant_claims_are_served(keyless: EngineProcess) -> None:
    body = _body()
    assert _post(keyless, body, {TENANT_HEADER: "someone"}).status_code == 200  # as before
    _assert_openai_error(_post(keyless, body, {TENANT_HEADER: "victim"}), 401)  # shared tier
    _assert_openai_error(_post(keyless, body, signed_headers(KEY, "victim", body)), 403)  # unverifiable


def test_metrics_name_no_tenant_and_a_bounded_set_of_workloads(keyless: EngineProcess) -> None:
    tenants = ["tenant-alpha", "tenant-bravo", "tenant-charlie"]
    workloads = ["chat", "code", "made-up-1", "made-up-2"]
    body = _body()
    for tenant in tenants:
        for workload in workloads:
            headers = {TENANT_HEADER: tenant, WORKLOAD_HEADER: workload}
            assert _post(keyless, body, headers).status_code == 200
    text = httpx.get(f"{keyless.url}/metrics").text
    assert "spec_decode_active_method" in text  # drift's series, which once named the tenant
    assert not [t for t in tenants if t in text]
    assert "tenant=" not in text
    labels = {
        part.split('"')[1]
        for line in text.splitlines()
        if not line.startswith("#")
        for part in line.split(",")
        if part.lstrip("{").startswith("workload=")
    }
    assert {"chat", "code", "other"} <= labels <= {*WORKLOADS, "other"}, labels
