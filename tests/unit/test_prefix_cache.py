"""The prefix KV cache: prompts that start like an earlier prompt of their scope skip
prefilling that prefix, and decode exactly as without the cache."""

from __future__ import annotations

import pytest
import torch
from heads import frequent_ids, save_random_head

from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.prefix_cache import Prefix, PrefixCache, shared_length
from speccore.proposers.base import ProposerConfig
from specprompts.sources import sharegpt_prompts

NEW_TOKENS = 24
SYSTEM = (
    "You are the support agent of a bicycle shop. Answer in two sentences, name the part a "
    "customer needs, and never promise a delivery date. "
)


def _prefix(tokens: list[int]) -> Prefix:
    """A stand-in entry: one layer, one float32 key and value a token (8 bytes a token)."""
    kv = torch.zeros(1, len(tokens), 1, dtype=torch.float32)
    return Prefix(tuple(tokens), [kv], [kv.clone()], None)


def test_shared_length_counts_leading_common_tokens():
    assert shared_length((1, 2, 3, 4), (1, 2, 3, 4, 5)) == 4
    assert shared_length((1, 2, 3, 4), (1, 2, 9, 4)) == 2
    assert shared_length((1, 2, 3), (7,)) == 0
    assert shared_length(tuple(range(100)), (*range(63), -1, *range(64, 100))) == 63


def test_lookup_takes_the_longest_shared_prefix_of_the_scope_only():
    cache = PrefixCache(min_tokens=4)
    cache.add("a", _prefix([1, 2, 3, 4, 5, 6]))
    cache.add("a", _prefix([1, 2, 3, 4, 7, 8, 9, 10]))
    found = cache.lookup("a", [1, 2, 3, 4, 7, 8, 0])
    assert found is not None and found.length == 6 and found.prefix.tokens[4] == 7
    assert cache.lookup("b", [1, 2, 3, 4, 7, 8, 0]) is None  # another tenant's prompts are not seen
    assert cache.lookup("a", [1, 2, 3, 0]) is None  # shorter than min_tokens
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.reused_tokens) == (3, 1, 6)


def test_a_scope_keeps_its_budget_dropping_least_recently_used_and_extended_prompts():
    cache = PrefixCache(max_bytes=35 * 8, max_scopes=2, min_tokens=2)  # 35 tokens
    first, second, third = ([s] * 10 for s in (1, 2, 3))
    for tokens in (first, second, third):
        cache.add("a", _prefix(tokens))
    assert cache.held_bytes == 30 * 8
    assert cache.lookup("a", first) is not None  # first is now the most recently used
    cache.add("a", _prefix([4] * 10))
    assert [t[0] for t in cache.scopes["a"]] == [3, 1, 4]  # second went
    cache.add("a", _prefix(first + [5] * 5))  # extends first: first goes, the rest fits
    assert [t[0] for t in cache.scopes["a"]] == [3, 4, 1]
    cache.add("b", _prefix(first))
    cache.add("c", _prefix(first))
    assert list(cache.scopes) == ["b", "c"]  # at most two scopes, the least recently used dropped
    assert cache.held_bytes == 2 * 10 * 8
    with pytest.raises(SpecError, match="positive"):
        PrefixCache(max_bytes=0)


@pytest.fixture(scope="module")
def agent_prompts(smollm) -> list[list[int]]:
    """Chat prompts that share one long system prompt, as an agent's calls do."""
    questions = [p.text for p in sharegpt_prompts(4, seed=3)]
    return [smollm.encode_prompt(SYSTEM * 3 + q, chat=True) for q in questions]


def _decode(engine: Engine, prompts: list[list[int]], batch: int) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        reqs = [Request(p, NEW_TOKENS, draft_scope="tenant") for p in prompts[i : i + batch]]
        out += [g.token_ids for g in engine.generate(reqs)]
    return out


@pytest.mark.parametrize("batch", [1, 3])
def test_reused_prefixes_decode_exactly_like_full_prefills(smollm, agent_prompts, batch):
    reference = _decode(Engine(smollm, "none"), agent_prompts, batch=1)
    cache = PrefixCache()
    engine = Engine(smollm, "ngram", ProposerConfig(k=4), prefix_cache=cache)
    # The first prompt alone, then the rest (batched rows reuse prefixes of different lengths).
    outputs = _decode(engine, agent_prompts[:1], 1) + _decode(engine, agent_prompts[1:], batch)
    assert outputs == reference
    assert cache.stats.hits == len(agent_prompts) - 1
    shared = len(smollm.tokenizer.encode(SYSTEM * 3)) - 1  # the last may merge with the question
    assert cache.stats.reused_tokens >= (len(agent_prompts) - 1) * shared


def test_a_reused_prefix_has_the_bits_of_a_full_prefill(smollm, agent_prompts):
    """The keys and values after a reused prefix equal a whole-prompt prefill's, bit for bit."""
    cached = Engine(smollm, "none", prefix_cache=PrefixCache())
    plain = Engine(smollm, "none")
    cached.open_batch([Request(agent_prompts[0], 1, draft_scope="tenant")])
    run = cached.open_batch([Request(agent_prompts[1], 1, draft_scope="tenant")])
    full = plain.open_batch([Request(agent_prompts[1], 1)])
    n = len(agent_prompts[1]) - 1
    assert int(run.cache.lengths[0]) == int(full.cache.lengths[0]) == n
    for got, want in zip(run.cache.read_prefix(0, n), full.cache.read_prefix(0, n), strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_heads_read_the_reused_prefix_features(smollm, agent_prompts, tmp_path):
    """EAGLE drafts from the target's features of the whole prompt: the reused part's come from
    the cache, and decoding is still exactly plain decoding's."""
    head = save_random_head(smollm, "eagle", tmp_path / "eagle", frequent_ids(smollm))
    config = ProposerConfig(head=str(head), k=3, tree_topk=2, tree_tokens=4)
    reference = _decode(Engine(smollm, "none"), agent_prompts[:3], batch=1)
    starts: list[torch.Tensor] = []
    cache = PrefixCache()
    engine = Engine(smollm, "eagle", config, prefix_cache=cache)
    original = engine.proposer.start

    def recording_start(seqs, features=None):
        starts.append(features.clone())
        original(seqs, features)

    engine.proposer.start = recording_start
    assert _decode(engine, agent_prompts[:1], 1) + _decode(engine, agent_prompts[1:3], 2) == reference
    assert cache.stats.hits == 2
    fresh = Engine(smollm, "eagle", config)
    _, full = fresh._forward(fresh.runner.new_cache(1, 1024), torch.tensor([agent_prompts[2][:-1]]))
    assert torch.equal(starts[1][1, : len(agent_prompts[2]) - 1], full[0])


def test_gemmas_sliding_window_layers_decode_alike_after_a_reused_prefix(gemma):
    """gemma-3 mixes sliding-window and full attention layers: a prompt longer than the window,
    most of it reused, decodes as after a whole prefill."""
    brief = SYSTEM * 20
    prompts = [gemma.encode_prompt(brief + q, chat=False) for q in ("Do you sell tyres?", "Brakes?")]
    assert len(prompts[1]) > gemma.model.config.sliding_window
    plain = Engine(gemma, "none")
    reference = [plain.generate([Request(p, NEW_TOKENS)])[0].token_ids for p in prompts]
    cache = PrefixCache()
    engine = Engine(gemma, "suffix", ProposerConfig(k=8), prefix_cache=cache)
    got = [engine.generate([Request(p, NEW_TOKENS, draft_scope="t")])[0].token_ids for p in prompts]
    assert got == reference
    assert cache.stats.hits == 1
    assert cache.stats.reused_tokens > gemma.model.config.sliding_window
