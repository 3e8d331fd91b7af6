"""Lossless on CUDA: every family's greedy output is the target's own greedy output.

On CPU speccore runs row-invariant kernels, so a verify block scores each token exactly
as plain decoding does. CUDA's kernels pick their reductions by shape; these tests show
what that means on a GPU, in float32: a request decoded alone by each family, and
requests joining and leaving a continuous batch. Skipped without a CUDA device
(tests/conftest.py); on a GPU host they are part of ``make test``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from speccore.batching import ContinuousBatcher
from speccore.draft_pool import DraftPools
from speccore.engine import Engine, Request
from speccore.models import LoadedModel, load_model
from speccore.prefix_cache import PrefixCache
from speccore.proposers.base import ProposerConfig

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TEXTS = [
    "Write a python function that reverses a list.",
    "What is the capital of France? Explain its history.",
    "List the seven wonders of the ancient world, then describe each.",
    "Tell me a story about a cat who learns to fly.",
]
CONFIGS = {
    "ngram": ProposerConfig(k=4),
    "lookahead": ProposerConfig(k=3),
    "medusa": ProposerConfig(head="builtin:medusa"),
    "eagle": ProposerConfig(head="builtin:eagle"),
    "eagle-tree16": ProposerConfig(head="builtin:eagle", tree_topk=4, tree_tokens=16),
    "draft_model": ProposerConfig(k=4, draft="self:12"),
    "suffix": ProposerConfig(k=16),
}
# Suffix as a factor-2 tree over the row's own tree and the scope's earlier outputs.
SUFFIX_TREE = ProposerConfig(k=16, knobs={"use_tree_spec": 1, "suffix_decoding_max_spec_factor": 2})


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return load_model("smollm2-135m-instruct", device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def requests(target) -> list[Request]:
    return [Request(target.encode_prompt(t, chat=True), max_new_tokens=96) for t in TEXTS]


@pytest.fixture(scope="module")
def plain(target, requests) -> list[list[int]]:
    engine = Engine(target)
    return [engine.generate([r])[0].token_ids for r in requests]


@pytest.mark.parametrize("label", list(CONFIGS))
def test_each_family_alone_emits_plain_greedy_tokens(target, requests, plain, label) -> None:
    engine = Engine(target, label.split("-")[0], CONFIGS[label])
    assert [engine.generate([r])[0].token_ids for r in requests] == plain


def test_suffix_trees_over_earlier_outputs_emit_plain_greedy_tokens(target, requests, plain) -> None:
    pools: DraftPools = DraftPools()
    engine = Engine(target, "suffix", SUFFIX_TREE, draft_pools=pools)
    for _ in range(2):  # the second pass drafts from the first pass's outputs too
        scoped = [replace(r, draft_scope="t") for r in requests]
        assert [engine.generate([r])[0].token_ids for r in scoped] == plain
    assert pools.totals.hits > 0


@pytest.mark.parametrize("method", ["none", "suffix"])
def test_prompts_reusing_cached_prefixes_emit_plain_greedy_tokens(target, requests, plain, method) -> None:
    # The prompts share their chat template's opening; the second pass finds each whole
    # prompt held. CUDA's kernels need not give a prefix's keys the bits they get inside
    # another prompt's prefill: this shows that on these prompts it changes no token.
    cache = PrefixCache()
    engine = Engine(target, method, CONFIGS.get(method), prefix_cache=cache)
    for _ in range(2):
        scoped = [replace(r, draft_scope="t") for r in requests]
        assert [engine.generate([r])[0].token_ids for r in scoped] == plain
    assert cache.stats.hits >= 2 * len(requests) - 1
    assert cache.stats.reused_tokens > sum(len(r.prompt_ids) for r in requests)


@pytest.mark.parametrize("method", ["none", "ngram", "eagle"])
def test_rows_joining_a_running_batch_get_their_solo_tokens(target, requests, plain, method) -> None:
    batcher = ContinuousBatcher(Engine(target, method, CONFIGS.get(method)), max_rows=8)
    order = [batcher.add(r) for r in requests[:2]]
    done: dict[int, list[int]] = {}
    steps = 0
    while not batcher.idle:
        steps += 1
        if steps == 5:
            order += [batcher.add(r) for r in requests[2:]]
        for update in batcher.step().updates:
            if update.finished and update.generation is not None:
                done[update.handle] = update.generation.token_ids
    assert [done[h] for h in order] == plain
