"""The cross-request n-gram pool (speccore.draft_pool, F-S1): what it drafts, that a scope
sees only its own entries, and that drafting from it is lossless on the real model (greedy
output is plain decoding's, alone or in a continuous batch)."""

from __future__ import annotations

import pytest

from speccore.batching import ContinuousBatcher
from speccore.draft_pool import DraftPool, DraftPools
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.proposers.base import ProposerConfig

TEXTS = [
    "Write a python function that reverses a list.",
    "List the seven wonders of the ancient world, then list them again.",
    "Tell me a story about a cat.",
    "Explain TCP in one line.",
]


def _ngram_pools(max_scopes: int = 64) -> DraftPools[DraftPool]:
    return DraftPools(DraftPool, max_scopes=max_scopes, kind="ngram")


def test_the_pool_drafts_what_followed_the_longest_suffix() -> None:
    pool = DraftPool(ngram_min=2, ngram_max=4, span=5)
    pool.add([1, 2, 3, 4], [5, 6, 7, 8, 9])  # prompt and output both indexed, across the seam
    pool.add([7, 2], [3, 40, 41])  # later: (2, 3) now continues with 40
    match = pool.lookup([9, 9, 1, 2, 3], k=3)
    assert match is not None and (match.length, match.tokens) == (3, [4, 5, 6])  # (1, 2, 3) is longer
    match = pool.lookup([9, 2, 3], k=8)
    assert match is not None and (match.length, match.tokens) == (2, [40, 41])
    assert pool.lookup([5, 1], k=3) is None  # a single token never matches (ngram_min 2)
    assert pool.sequences == 2


def test_the_pool_keeps_at_most_its_size_dropping_the_oldest() -> None:
    pool = DraftPool(ngram_min=2, ngram_max=2, span=2, max_entries=3)
    pool.add([1, 2, 3], [4, 5, 6])  # (1,2) (2,3) (3,4) (4,5)
    assert len(pool) == 3
    assert pool.lookup([1, 2], k=2) is None
    assert pool.lookup([4, 5], k=2).tokens == [6]  # type: ignore[union-attr]


def test_a_scope_sees_none_of_another_scopes_entries() -> None:
    pools = _ngram_pools()
    pools.add("tenant-a", [5, 6], [7, 8, 9, 10])
    assert pools.pool("tenant-a").lookup([5, 6, 7], k=3).tokens == [8, 9, 10]  # type: ignore[union-attr]
    assert pools.pool("tenant-b").lookup([5, 6, 7], k=3) is None
    assert len(pools.pool("tenant-b")) == 0
    pools.record("tenant-a", 3)
    pools.record("tenant-b", None)
    assert (pools.stats["tenant-a"].hits, pools.stats["tenant-a"].draft_tokens) == (1, 3)
    assert (pools.stats["tenant-b"].lookups, pools.stats["tenant-b"].hits) == (1, 0)
    assert (pools.totals.lookups, pools.totals.hits, pools.totals.draft_tokens) == (2, 1, 3)


def test_past_max_scopes_the_least_recently_used_scopes_pool_is_dropped() -> None:
    pools = _ngram_pools(max_scopes=2)
    pools.add("a", [1, 2], [3, 4])
    pools.add("b", [1, 2], [3, 5])
    assert pools.pool("a").lookup([1, 2], k=2) is not None  # a used after b
    pools.add("c", [1, 2], [3, 6])  # one scope too many: b's pool goes
    assert list(pools.pools) == ["a", "c"] and set(pools.stats) == {"a", "c"}
    assert pools.pool("b").lookup([1, 2], k=2) is None  # b starts over, empty
    assert list(pools.pools) == ["c", "b"]


def test_pools_serve_one_kind_of_proposer() -> None:
    pools = _ngram_pools()
    with pytest.raises(SpecError, match="hold ngram pools, not suffix"):
        pools.bind("suffix", DraftPool)
    with pytest.raises(SpecError, match="bound to no proposer"):
        DraftPools().pool("a")


@pytest.mark.slow
def test_only_a_family_that_reads_pools_takes_them(smollm) -> None:
    with pytest.raises(SpecError, match="cross-request pool"):
        Engine(smollm, "none", draft_pools=DraftPools())


@pytest.mark.slow
def test_greedy_output_with_the_pool_is_plain_decoding(smollm) -> None:
    """Each prompt twice, the second time with its first run's text in the pool (and, in a
    continuous batch, beside the others): the pool drafts for the repeats, and every output
    is plain decoding's."""
    prompts = [smollm.encode_prompt(t, chat=True) for t in TEXTS]
    plain = Engine(smollm, "none").generate([Request(p, 24) for p in prompts])
    pools = DraftPools()
    engine = Engine(smollm, "ngram", ProposerConfig(k=4), draft_pools=pools)
    first = engine.generate([Request(p, 24, draft_scope="t") for p in prompts])
    assert pools.pool("t").sequences == len(prompts)
    batcher = ContinuousBatcher(engine, max_rows=3)
    handles = {batcher.add(Request(p, 24, draft_scope="t")): i for i, p in enumerate(prompts)}
    again: dict[int, list[int]] = {}
    while not batcher.idle:
        for u in batcher.step().updates:
            if u.finished and u.generation is not None:
                again[handles[u.handle]] = u.generation.token_ids
    assert [g.token_ids for g in first] == [g.token_ids for g in plain]
    assert [again[i] for i in range(len(prompts))] == [g.token_ids for g in plain]
    assert pools.stats["t"].draft_tokens > 0


@pytest.mark.slow
def test_a_request_of_another_scope_drafts_nothing_from_the_first_scopes_pool(smollm) -> None:
    prompt = smollm.encode_prompt(TEXTS[1], chat=True)
    pools = DraftPools()
    engine = Engine(smollm, "ngram", ProposerConfig(k=4), draft_pools=pools)
    engine.generate([Request(prompt, 32, draft_scope="tenant-a")])
    b = engine.generate([Request(prompt, 32, draft_scope="tenant-b")])[0]
    a = engine.generate([Request(prompt, 32, draft_scope="tenant-a")])[0]
    assert pools.stats["tenant-b"].hits == 0 and pools.stats["tenant-a"].draft_tokens > 0
    # The repeat in tenant a's scope accepts more than the first ask in b's: the pool's effect.
    assert a.metrics.accepted_tokens > b.metrics.accepted_tokens
    assert a.token_ids == b.token_ids
