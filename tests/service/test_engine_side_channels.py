"""Issue 20's side-channel mitigations in `specops serve engine` (its own process, smollm2 with
n-gram and the cross-request draft pool, real NATS): paced release (F-S2) delivers plain
decoding's text, streamed or not; a tenant whose policy keeps caches per tenant drafts nothing
from another tenant's pool entries and reuses no prefix another tenant's prompt left in the
prefix cache (F-S1), while tenants of the single-tenant tier share them;
an opted-out tenant is decoded without speculation (F-S3); a `policy_changed` event on the bus
changes a tenant's policy. What the tests read is the text and /metrics, never timing
(bench/side_channel.py measures the timing)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fixtures.bus import publish_all
from fixtures.engine import engine_server

from specbus.envelope import new_event
from speccore.engine import Engine, Request
from speccore.models import LoadedModel
from specops_schemas.security import PolicyChanged, SecurityPolicy, SecurityTier
from specplatform.tenant_signature import TenantSigner

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 24
PACE_MS = 10
KEY = b"side-channel-test-tenant-key-0123456789"  # the trusted proxy's, which signs the claims
TEXTS = [
    "def fibonacci(n):\n    ",
    "List the planets of the solar system, then list them again:",
    "The quick brown fox",
]
POLICIES = [
    SecurityPolicy(tenant_id="iso-a", version=1, tier=SecurityTier.SHARED),
    SecurityPolicy(tenant_id="iso-b", version=1, tier=SecurityTier.SHARED),
    SecurityPolicy(
        tenant_id="optout", version=1, tier=SecurityTier.MULTI_TENANT_ISOLATED, speculation_opt_out=True
    ),
]


BUS_POLICY = SecurityPolicy(
    tenant_id="bus-optout", version=1, tier=SecurityTier.MULTI_TENANT_ISOLATED, speculation_opt_out=True
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, nats_url: str) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("engine")
    policies = tmp / "policies.json"
    policies.write_text(json.dumps([p.model_dump(mode="json") for p in POLICIES]))
    args = ["--model", MODEL, "--method", "ngram", "--draft-pool", "--prefix-cache-mb", "64"]
    args += ["--jitter", "pace"]
    key = tmp / "tenant.key"
    key.write_bytes(KEY)
    args += ["--tenant-key-file", str(key)]
    args += [
        "--jitter-interval-ms",
        str(PACE_MS),
        "--security-policies",
        str(policies),
        "--nats-url",
        nats_url,
    ]
    log = tmp / "engine.log"
    # A tenant's policy that only the bus has: the server must have it before it serves.
    asyncio.run(publish_all(nats_url, [_changed(BUS_POLICY)]))
    with engine_server(args, log) as server:
        yield server.url, log


def _changed(policy: SecurityPolicy) -> Any:
    return new_event(
        PolicyChanged(tenant_id=policy.tenant_id, policy=policy),
        tenant_id=policy.tenant_id,
        correlation_id="test",
        producer="security",
    )


def _client(url: str, tenant: str | None = None) -> openai.OpenAI:
    """A client of the default tenant, or one that speaks for ``tenant`` as the trusted proxy."""
    http = httpx.Client(auth=TenantSigner(KEY, tenant), timeout=120) if tenant else None
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=http)


def _complete(url: str, text: str, tenant: str | None = None) -> str:
    with _client(url, tenant) as c:
        r = c.completions.create(model=MODEL, prompt=text, max_tokens=MAX_TOKENS, temperature=0)
    return r.choices[0].text


def _plain(target: LoadedModel, text: str) -> str:
    ids = target.encode_prompt(text, chat=False)
    return Engine(target, "none").generate([Request(ids, MAX_TOKENS)])[0].text


def _metric(url: str, name: str) -> float:
    """The value of the series ``specops:<name>``; 0 when it does not exist."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"specops:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_paced_release_delivers_plain_decodings_text_streamed_or_not(
    engine: tuple[str, Path], smollm: LoadedModel
) -> None:
    url, _ = engine
    before = _metric(url, "paced_tokens_total")
    with _client(url) as c:  # the default tenant: paced by the flags
        sent = time.monotonic()
        stream = c.completions.create(
            model=MODEL,
            prompt=TEXTS[0],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks, arrivals = [], []
        for chunk in stream:
            chunks.append(chunk)
            arrivals.append(time.monotonic())
        whole = c.completions.create(model=MODEL, prompt=TEXTS[2], max_tokens=MAX_TOKENS, temperature=0)
        chat = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": TEXTS[1]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == _plain(smollm, TEXTS[0])
    assert whole.choices[0].text == _plain(smollm, TEXTS[2])
    ids = smollm.encode_chat([{"role": "user", "content": TEXTS[1]}])
    assert (
        chat.choices[0].message.content == Engine(smollm, "none").generate([Request(ids, MAX_TOKENS)])[0].text
    )
    # One token a chunk (n-gram drafts several a step on this code prompt), token i no sooner
    # than i intervals after the request was sent (the server's clock and ours are the same
    # monotonic clock): no burst shows what a step accepted.
    texts = [
        at for chunk, at in zip(chunks, arrivals, strict=True) if chunk.choices and chunk.choices[0].text
    ]
    assert len(texts) == chunks[-1].usage.completion_tokens
    early = [i for i, at in enumerate(texts) if at - sent < i * PACE_MS / 1000]
    assert not early, f"tokens {early} came before their slot"
    usages = [chunks[-1].usage, whole.usage, chat.usage]
    paced = sum(u.completion_tokens for u in usages if u is not None)
    assert _metric(url, "paced_tokens_total") - before == paced > 0  # every token paced


def test_per_tenant_caches_keep_a_tenants_pool_entries_from_another(engine: tuple[str, Path]) -> None:
    url, _ = engine
    text = TEXTS[1]
    scopes = _metric(url, "draft_pool_scopes")
    first = _complete(url, text, "iso-a")
    assert _metric(url, "draft_pool_scopes") == scopes + 1  # a pool of its own
    lookups, hits = _metric(url, "draft_pool_lookups_total"), _metric(url, "draft_pool_hits_total")
    assert _complete(url, text, "iso-b") == first
    assert _metric(url, "draft_pool_lookups_total") > lookups  # it asked its own pool
    assert _metric(url, "draft_pool_hits_total") == hits  # which has none of a's entries
    # Two tenants of the single-tenant tier (no policy of their own) share one pool: the second
    # drafts from the first's entries.
    assert _complete(url, text, "single-x") == first
    hits = _metric(url, "draft_pool_hits_total")
    assert _complete(url, text, "single-y") == first
    assert _metric(url, "draft_pool_hits_total") > hits
    # /metrics says how the pools do, not how much each tenant asks.
    assert "iso-a" not in httpx.get(f"{url}/metrics").text


def test_a_tenants_prefix_cache_serves_only_that_tenants_later_prompts(
    engine: tuple[str, Path], smollm: LoadedModel
) -> None:
    url, _ = engine
    brief = "You are a release bot. Reply with one line that names the version and the date. " * 3
    first, second = brief + "Version 2.1 ships today.", brief + "Version 2.2 ships tomorrow."
    queried, hits = _metric(url, "prefix_cache_queries_total"), _metric(url, "prefix_cache_hits_total")
    assert _complete(url, first, "iso-a") == _plain(smollm, first)
    assert _metric(url, "prefix_cache_queries_total") > queried
    assert _metric(url, "prefix_cache_hits_total") == hits  # nothing held yet
    assert _complete(url, second, "iso-b") == _plain(smollm, second)
    assert _metric(url, "prefix_cache_hits_total") == hits  # a's prompt is not b's to reuse
    with _client(url, "iso-a") as c:
        again = c.completions.create(model=MODEL, prompt=second, max_tokens=MAX_TOKENS, temperature=0)
    assert again.choices[0].text == _plain(smollm, second)
    shared = len(smollm.encode_prompt(brief, chat=False)) - 1
    assert _metric(url, "prefix_cache_hits_total") - hits >= shared  # a's own brief was reused
    assert again.usage.prompt_tokens_details.cached_tokens >= shared  # and usage says so
    assert _metric(url, "prefix_cache_bytes") > 0


def test_an_opted_out_tenant_is_decoded_without_speculation(
    engine: tuple[str, Path], smollm: LoadedModel
) -> None:
    url, _ = engine
    drafts = _metric(url, "spec_decode_num_drafts_total")
    lookups, indexed = _metric(url, "draft_pool_lookups_total"), _metric(url, "draft_pool_requests")
    assert _complete(url, TEXTS[0], "optout") == _plain(smollm, TEXTS[0])
    assert _metric(url, "spec_decode_num_drafts_total") == drafts
    assert (_metric(url, "draft_pool_lookups_total"), _metric(url, "draft_pool_requests")) == (
        lookups,
        indexed,
    )


def test_the_server_has_the_bus_policies_before_it_serves(engine: tuple[str, Path]) -> None:
    url, log = engine
    text = log.read_text()
    applied = text.find("tenant bus-optout's security policy is now version 1")
    assert 0 <= applied < text.find("Application startup complete"), text[-2000:]
    drafts = _metric(url, "spec_decode_num_drafts_total")
    _complete(url, TEXTS[0], "bus-optout")
    assert _metric(url, "spec_decode_num_drafts_total") == drafts  # opted out: no draft


def test_a_policy_changed_event_changes_the_tenants_policy(engine: tuple[str, Path], nats_url: str) -> None:
    url, log = engine
    policy = SecurityPolicy(tenant_id="late", version=1, tier=SecurityTier.SHARED)
    asyncio.run(publish_all(nats_url, [_changed(policy)]))
    deadline = time.monotonic() + 30
    while "tenant late's security policy is now version 1" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    scopes = _metric(url, "draft_pool_scopes")
    _complete(url, TEXTS[2], "late")
    assert _metric(url, "draft_pool_scopes") == scopes + 1  # its own pool now
