"""Rolling back and compacting the cache leaves no trace: after any verify step the
target's logits equal those of a fresh forward pass over the kept tokens.

The reference is the model's own forward pass (Hugging Face masks and positions,
no cache), so a mistake shared by the runner and the cache cannot hide.
"""

from __future__ import annotations

import pytest
import torch

from speccore.kv_cache import KV_BLOCK, StaticKVCache
from speccore.runner import ModelRunner
from speccore.tree import block_parents

pytestmark = pytest.mark.slow

ATOL = 1e-4
WRONG = [1000, 2000, 3000]  # drafts the target does not agree with


@pytest.fixture(scope="module")
def runner(smollm) -> ModelRunner:
    return ModelRunner(smollm.model)


@pytest.fixture(scope="module")
def reference(smollm):
    """Logits after the last token of ids, from a plain uncached forward pass."""

    @torch.inference_mode()
    def logits_after(ids: list[int]) -> torch.Tensor:
        return smollm.model(torch.tensor([ids])).logits[0, -1].float()

    return logits_after


@pytest.fixture(scope="module")
def prompts(smollm) -> list[list[int]]:
    texts = ["The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]
    return [smollm.encode_prompt(t, chat=False) for t in texts]


def _prefill(runner: ModelRunner, prompts: list[list[int]], capacity: int = 64) -> StaticKVCache:
    """Commit each prompt but its last token (the first pending token), right-padded."""
    cache = runner.new_cache(len(prompts), capacity)
    width = max(len(p) for p in prompts) - 1
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        tokens[row, : len(p) - 1] = torch.tensor(p[:-1])
    runner.forward(cache, tokens)
    cache.commit(torch.tensor([len(p) - 1 for p in prompts]))
    return cache


def _block_logits(runner: ModelRunner, cache: StaticKVCache, tokens: list[list[int]], parents=None):
    """[batch, q, vocab] target logits of one block (draft-relative parents, or a chain)."""
    par = block_parents(torch.tensor(parents)) if parents is not None else None
    return runner.logits(runner.forward(cache, torch.tensor(tokens), par))


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.allclose(actual, expected, atol=ATOL, rtol=0), float((actual - expected).abs().max())


def test_rejected_chain_leaves_no_trace(runner, reference, prompts) -> None:
    ids = prompts[0]
    cache = _prefill(runner, [ids])
    first = _block_logits(runner, cache, [[ids[-1], *WRONG]])
    _assert_close(first[0, 0], reference(ids))
    cache.commit_paths([[0]])
    assert cache.lengths.tolist() == [len(ids)]

    token = int(first[0, 0].argmax())
    after = _block_logits(runner, cache, [[token, 7, 8]])  # the next step's pending token and drafts
    _assert_close(after[0, 0], reference(ids + [token]))
    _assert_close(after[0, 2], reference(ids + [token, 7, 8]))


def test_partly_accepted_chain_keeps_the_accepted_prefix(runner, reference, prompts) -> None:
    ids = prompts[1]
    cache = _prefill(runner, [ids])
    good = int(reference(ids).argmax())
    _block_logits(runner, cache, [[ids[-1], good, *WRONG]])
    cache.commit_paths([[0, 1]])
    nxt = _block_logits(runner, cache, [[42]])
    _assert_close(nxt[0, 0], reference(ids + [good, 42]))


def test_tree_accepted_through_the_second_branch_is_compacted(runner, reference, prompts) -> None:
    ids = prompts[0]
    cache = _prefill(runner, [ids])
    #        pending
    #        /     \
    #   1: 1000   2: 3681
    #      |        |
    #   3: 2000   4: 9 -- 5: 300
    a, b = 1000, 3681
    tokens = [[ids[-1], a, b, 2000, 9, 300]]
    logits = _block_logits(runner, cache, tokens, parents=[[-1, -1, 0, 1, 3]])
    # Tree attention: every node sees exactly its own branch.
    _assert_close(logits[0, 1], reference(ids + [a]))
    _assert_close(logits[0, 2], reference(ids + [b]))
    _assert_close(logits[0, 3], reference(ids + [a, 2000]))
    _assert_close(logits[0, 5], reference(ids + [b, 9, 300]))

    cache.commit_paths([[0, 2, 4]])
    assert cache.lengths.tolist() == [len(ids) + 2]
    nxt = _block_logits(runner, cache, [[77, 78]])
    _assert_close(nxt[0, 0], reference(ids + [b, 9, 77]))
    _assert_close(nxt[0, 1], reference(ids + [b, 9, 77, 78]))


def test_right_padded_rows_of_different_lengths(runner, reference, prompts) -> None:
    short, long_ = prompts
    assert len(long_) > len(short) + 3  # the short row sees padding and stale slots in the block width
    cache = _prefill(runner, [short, long_])

    # Step 1: the short row accepts its two drafts, the long row rejects both.
    g1 = int(reference(short).argmax())
    g2 = int(reference(short + [g1]).argmax())
    step1 = _block_logits(runner, cache, [[short[-1], g1, g2], [long_[-1], *WRONG[:2]]])
    _assert_close(step1[0, 0], reference(short))
    _assert_close(step1[0, 2], reference(short + [g1, g2]))
    _assert_close(step1[1, 0], reference(long_))
    cache.commit_paths([[0, 1, 2], [0]])

    # Step 2: a tree in both rows; the short row takes the second branch, the long row the first.
    x = int(step1[1, 0].argmax())
    step2 = _block_logits(
        runner, cache, [[5, 11, 12, 13], [x, 21, 22, 23]], parents=[[-1, -1, 1], [-1, -1, 0]]
    )
    _assert_close(step2[0, 3], reference(short + [g1, g2, 5, 12, 13]))
    _assert_close(step2[1, 3], reference(long_ + [x, 21, 23]))
    cache.commit_paths([[0, 2, 3], [0, 1, 3]])

    # Step 3: plain decoding from the compacted caches.
    step3 = _block_logits(runner, cache, [[6], [7]])
    _assert_close(step3[0, 0], reference(short + [g1, g2, 5, 12, 13, 6]))
    _assert_close(step3[1, 0], reference(long_ + [x, 21, 23, 7]))


def test_a_block_past_capacity_grows_the_cache_and_keeps_what_it_holds() -> None:
    cache, written = _filled(2, 100, 120, seed=3)
    assert cache.capacity == 2 * KV_BLOCK  # rounded up to whole blocks
    assert cache.begin_block(8) == 128  # fits exactly: no growth
    assert cache.capacity == 128
    assert cache.begin_block(9) == 192  # one past: the cache grows (doubling) and the width follows
    assert cache.capacity == 256
    for layer in range(2):
        assert torch.equal(_rows_of(cache, layer, 120), written[layer])


def _filled(batch: int, capacity: int, length: int, seed: int) -> tuple[StaticKVCache, list[torch.Tensor]]:
    """A cache of ``batch`` rows whose first ``length`` slots hold random keys/values (2 layers)."""
    cache = StaticKVCache(batch, capacity, torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(seed)
    written = []
    cache.begin_block(length)
    for layer in range(2):
        kv = torch.randn(batch, 2, length, 4, generator=gen)
        cache.update(kv, -kv, layer)
        written.append(kv)
    cache.commit(torch.full((batch,), length))
    return cache, written


def _rows_of(cache: StaticKVCache, layer: int, length: int) -> torch.Tensor:
    keys = cache._keys[layer][: cache.batch, :, :length]
    values = cache._values[layer][: cache.batch, :, :length]
    assert torch.equal(values, -keys)
    return keys


def test_rows_join_into_spare_slots_and_leave_by_moving_only_the_rows_that_move() -> None:
    a, a_kv = _filled(3, 64, 5, seed=1)
    b, b_kv = _filled(2, 200, 5, seed=2)
    joined = a.concat(b)  # grows: more rows and positions than a has
    assert joined is a and joined.batch == 5 and joined.slots >= 6 and joined.capacity >= b.capacity
    for layer in range(2):
        assert torch.equal(_rows_of(joined, layer, 5), torch.cat([a_kv[layer], b_kv[layer]]))
    buffer = joined._keys[0].data_ptr()
    kept = joined.take([0, 4, 2])  # rows 1 and 3 leave; row 4 moves into slot 1
    assert kept is joined and kept.lengths.tolist() == [5, 5, 5]
    everything = torch.cat([a_kv[0], b_kv[0]])
    assert torch.equal(_rows_of(kept, 0, 5), everything[[0, 4, 2]])
    c, c_kv = _filled(2, 64, 5, seed=3)
    again = kept.concat(c)  # fits the spare slots: no new buffer
    assert again._keys[0].data_ptr() == buffer and again.batch == 5
    assert torch.equal(_rows_of(again, 0, 5), torch.cat([everything[[0, 4, 2]], c_kv[0]]))
