"""Prompt lookup drafts what followed the latest earlier occurrence of the longest suffix."""

from __future__ import annotations

import random

from speccore.proposers.ngram import NgramIndex, lookup


def test_longest_most_recent_match_drafts_k_tokens():
    tokens = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 4, 1, 2, 3]
    # [1, 2, 3] occurs twice before the end; the latest is followed by 7, 8, 0.
    assert lookup(tokens, k=3, ngram_min=1, ngram_max=4) == [7, 8, 0]


def test_a_one_token_match_still_drafts_k_tokens():
    # Verifying k tokens costs about as much as one (packed CPU kernels, GPUs), so even
    # a weak match is worth probing in full.
    tokens = [1, 2, 3, 4, 5, 6, 2]
    assert lookup(tokens, k=3, ngram_min=1, ngram_max=4) == [3, 4, 5]


def test_no_match_drafts_nothing():
    assert lookup([1, 2, 3, 4], k=5, ngram_min=1, ngram_max=4) == []
    assert lookup([1, 2, 1, 2], k=5, ngram_min=3, ngram_max=4) == []


def _scan(tokens: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The definition, by brute force: the latest earlier occurrence of the longest suffix."""
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_the_index_kept_across_steps_drafts_what_a_full_scan_drafts() -> None:
    rng = random.Random(0)
    for trial in range(200):
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        index = NgramIndex(lo, hi)
        tokens = [rng.randrange(4 + trial % 5) for _ in range(rng.randint(1, 6))]
        for _ in range(12):  # a sequence growing by a few accepted tokens a step
            k = rng.randint(1, 6)
            assert index.lookup(tokens, k) == _scan(tokens, k, lo, hi), (tokens, lo, hi, k)
            tokens += [rng.randrange(4 + trial % 5) for _ in range(rng.randint(1, 4))]
