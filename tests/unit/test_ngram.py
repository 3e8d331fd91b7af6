"""Prompt lookup drafts what followed the latest earlier occurrence of the longest suffix."""

from __future__ import annotations

import numpy as np

from speccore.proposers.ngram import lookup


def test_longest_most_recent_match_drafts_k_tokens():
    tokens = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 4, 1, 2, 3])
    # [1, 2, 3] occurs twice before the end; the latest is followed by 7, 8, 0.
    assert lookup(tokens, k=3, ngram_min=1, ngram_max=4) == [7, 8, 0]


def test_a_one_token_match_still_drafts_k_tokens():
    # Verifying k tokens costs about as much as one (packed CPU kernels, GPUs), so even
    # a weak match is worth probing in full.
    tokens = np.array([1, 2, 3, 4, 5, 6, 2])
    assert lookup(tokens, k=3, ngram_min=1, ngram_max=4) == [3, 4, 5]


def test_no_match_drafts_nothing():
    assert lookup(np.array([1, 2, 3, 4]), k=5, ngram_min=1, ngram_max=4) == []
    assert lookup(np.array([1, 2, 1, 2]), k=5, ngram_min=3, ngram_max=4) == []
