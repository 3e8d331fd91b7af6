"""Prompt lookup drafts what followed the latest earlier occurrence of the longest suffix."""

from __future__ import annotations

import numpy as np

from speccore.proposers.ngram import CONFIDENT_MATCH, lookup


def test_longest_most_recent_match_drafts_k_tokens():
    tokens = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 4, 1, 2, 3])
    # [1, 2, 3] occurs twice before the end; the latest is followed by 7, 8, 0.
    assert lookup(tokens, k=3, ngram_min=1, ngram_max=4) == [7, 8, 0]


def test_short_match_drafts_only_as_many_tokens_as_it_matched():
    tokens = np.array([1, 2, 3, 4, 5, 6, 2])
    assert CONFIDENT_MATCH > 1
    assert lookup(tokens, k=5, ngram_min=1, ngram_max=4) == [3]


def test_no_match_drafts_nothing():
    assert lookup(np.array([1, 2, 3, 4]), k=5, ngram_min=1, ngram_max=4) == []
    assert lookup(np.array([1, 2, 1, 2]), k=5, ngram_min=3, ngram_max=4) == []
