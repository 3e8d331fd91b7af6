"""Continuous batching on the real model: requests that join a running batch
between steps, and leave it when done, get exactly the tokens they get alone.

Every drafting family keeps per-row state across steps (KV caches, pools,
features); joining and leaving moves it with the row. The kernels are
row-invariant, so greedy output is the request's own greedy output, and seeded
sampling draws the same tokens whoever shares the batch.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from speccore.adaptive import AdaptiveK
from speccore.batching import PREFILL_PAD, PREFILL_SLACK, ContinuousBatcher, prefill_groups
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.proposers.base import ProposerConfig
from speccore.sampling import SamplingParams

pytestmark = pytest.mark.slow

TEXTS = [
    "Write a python function that reverses a list.",
    "What is the capital of France?",
    "List the seven wonders of the ancient world, then list them again.",
    "Tell me a story about a cat.",
    "1, 2, 3, 4, 5,",
    "Explain TCP in one line.",
]
SETTINGS = [
    ("none", ProposerConfig()),
    ("ngram", ProposerConfig(k=4)),
    ("lookahead", ProposerConfig(k=3)),
    ("medusa", ProposerConfig(head="builtin:medusa")),
    ("eagle", ProposerConfig(k=3, head="builtin:eagle")),
    ("draft_model", ProposerConfig(k=3, draft="self:8")),
    ("suffix", ProposerConfig(k=6)),
]
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9)


@pytest.fixture(scope="module")
def prompts(smollm) -> list[list[int]]:
    return [smollm.encode_prompt(text, chat=True) for text in TEXTS]


def staggered(batcher: ContinuousBatcher, requests: list[Request], *, first: int, later_step: int):
    """Submit ``first`` requests, the rest before step ``later_step``; run until idle.

    Returns each request's tokens as the updates streamed them, the finished generations
    by request, and the largest number of rows that ran at once."""
    index = {batcher.add(r): i for i, r in enumerate(requests[:first])}
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    finished = {}
    peak, steps = 0, 0
    while not batcher.idle:
        steps += 1
        if steps == later_step:
            index |= {batcher.add(r): i for i, r in enumerate(requests[first:], start=first)}
        report = batcher.step()
        peak = max(peak, batcher.running + sum(u.finished for u in report.updates))
        for update in report.updates:
            streamed[index[update.handle]] += update.tokens
            if update.finished:
                finished[index[update.handle]] = update.generation
    return streamed, finished, peak


# Sampled: the families whose drafting draws from the request's generator, and plain decoding.
CASES = [(m, c, GREEDY) for m, c in SETTINGS] + [
    (m, c, SAMPLED) for m, c in SETTINGS if m in ("none", "eagle", "draft_model")
]


# Beyond make test's budget (make test-full runs them): the slowest cases, whose families the
# other cases and tests of this module cover.
LONG_CASES = {
    "lookahead-greedy", "medusa-greedy", "draft_model-greedy", "draft_model-sampled", "eagle-sampled",
}  # fmt: skip


def _case(method: str, config: ProposerConfig, sampling: SamplingParams) -> Any:
    label = f"{method}-{'greedy' if sampling.greedy else 'sampled'}"
    marks = [pytest.mark.long] if label in LONG_CASES else []
    return pytest.param(method, config, sampling, id=label, marks=marks)


@pytest.mark.parametrize(("method", "config", "sampling"), [_case(*c) for c in CASES])
def test_rows_joining_and_leaving_get_their_solo_tokens(smollm, prompts, method, config, sampling) -> None:
    engine = Engine(smollm, method, config)
    # Different lengths, so rows finish at different steps and the late ones join mid-run.
    requests = [
        Request(p, max_new_tokens=6 + 3 * i, sampling=sampling, seed=None if sampling.greedy else 11 + i)
        for i, p in enumerate(prompts)
    ]
    solo = [engine.generate([r])[0] for r in requests]
    streamed, finished, peak = staggered(
        ContinuousBatcher(engine, max_rows=3), requests, first=4, later_step=3
    )
    assert peak == 3  # the cap held, and rows really shared steps
    for i, alone in enumerate(solo):
        assert streamed[i] == alone.token_ids, f"request {i}"
        assert finished[i].token_ids == alone.token_ids
        assert finished[i].finish_reason == alone.finish_reason
        assert finished[i].metrics.new_tokens == len(alone.token_ids)


def test_requests_of_different_sampling_settings_share_a_step(smollm, prompts) -> None:
    engine = Engine(smollm, "ngram", ProposerConfig(k=4))
    requests = [
        Request(p, max_new_tokens=10, sampling=GREEDY if i % 2 else SAMPLED, seed=5)
        for i, p in enumerate(prompts)
    ]
    solo = [engine.generate([r])[0].token_ids for r in requests]
    streamed, _, _ = staggered(ContinuousBatcher(engine, max_rows=8), requests, first=6, later_step=0)
    assert [streamed[i] for i in range(len(requests))] == solo


def test_drafted_and_accepted_counts_add_up_to_each_rows_metrics(smollm, prompts) -> None:
    engine = Engine(smollm, "ngram", ProposerConfig(k=4))
    batcher = ContinuousBatcher(engine, max_rows=4)
    handles = [batcher.add(Request(p, max_new_tokens=16)) for p in prompts]
    drafted = dict.fromkeys(handles, 0)
    accepted = dict.fromkeys(handles, 0)
    metrics = {}
    while not batcher.idle:
        for u in batcher.step().updates:
            drafted[u.handle] += u.drafted
            accepted[u.handle] += u.accepted
            if u.finished:
                metrics[u.handle] = u.generation.metrics
    assert sum(accepted.values()) > 0  # the list-copying prompt drafts and accepts
    for h in handles:
        assert (drafted[h], accepted[h]) == (metrics[h].drafted_tokens, metrics[h].accepted_tokens)


def test_a_cancelled_request_leaves_and_the_others_finish(smollm, prompts) -> None:
    engine = Engine(smollm, "ngram", ProposerConfig(k=4))
    requests = [Request(p, max_new_tokens=12) for p in prompts[:4]]
    batcher = ContinuousBatcher(engine, max_rows=2)
    handles = [batcher.add(r) for r in requests]
    streamed = {h: batcher.step() and [] for h in handles[:1]}  # one step: the first two run
    batcher.cancel(handles[0])  # running
    batcher.cancel(handles[3])  # still waiting
    streamed = {h: [] for h in handles}
    done: set[int] = set()
    while not batcher.idle:
        for u in batcher.step().updates:
            streamed[u.handle] += u.tokens
            done |= {u.handle} if u.finished else set()
    assert done == {handles[1], handles[2]}
    assert not streamed[handles[0]] and not streamed[handles[3]]
    # The request admitted into the cancelled one's row decodes as it does alone.
    assert streamed[handles[2]] == engine.generate([requests[2]])[0].token_ids


def test_a_request_that_cannot_fit_is_refused_when_added(smollm, prompts) -> None:
    batcher = ContinuousBatcher(Engine(smollm, "none"))
    with pytest.raises(SpecError, match="exceeds the model's context"):
        batcher.add(Request(prompts[0], max_new_tokens=smollm.max_context))
    with pytest.raises(SpecError, match="empty"):
        batcher.add(Request([], max_new_tokens=4))
    assert batcher.idle


def test_requests_of_different_methods_share_a_step(smollm, prompts) -> None:
    engines = {"ngram": Engine(smollm, "ngram", ProposerConfig(k=4)), "none": Engine(smollm, "none")}
    batcher = ContinuousBatcher(engines, max_rows=8)
    assert batcher.methods == ["ngram", "none"]
    methods = ["ngram" if i % 2 else "none" for i in range(len(prompts))]
    requests = [Request(p, max_new_tokens=10) for p in prompts]
    index = {batcher.add(r, m): i for i, (r, m) in enumerate(zip(requests, methods, strict=True))}
    streamed: dict[int, list[int]] = {i: [] for i in index.values()}
    drafted: dict[int, int] = dict.fromkeys(index.values(), 0)
    while not batcher.idle:
        for u in batcher.step().updates:
            assert u.method == methods[index[u.handle]]
            streamed[index[u.handle]] += u.tokens
            drafted[index[u.handle]] += u.drafted
    for i, (r, m) in enumerate(zip(requests, methods, strict=True)):
        assert streamed[i] == engines[m].generate([r])[0].token_ids
        assert (drafted[i] > 0) == (m == "ngram" and bool(streamed[i]))
    with pytest.raises(SpecError, match="no engine for method 'eagle'"):
        batcher.add(requests[0], "eagle")


# make test keeps ngram and eagle; draft_model and suffix are `long`.
ADAPTIVE = [
    pytest.param(m, c, id=m, marks=[pytest.mark.long] if m in ("draft_model", "suffix") else [])
    for m, c in SETTINGS
    if m in ("ngram", "eagle", "draft_model", "suffix")
]


@pytest.mark.parametrize(("method", "config"), ADAPTIVE)
def test_adaptive_k_keeps_greedy_output_plain(smollm, prompts, method, config) -> None:
    """Adaptive k changes how much each step drafts, never what is emitted: greedy output
    through the batcher and through Engine.generate equals plain decoding's."""
    requests = [Request(p, max_new_tokens=6 + 3 * i) for i, p in enumerate(prompts)]
    plain = [g.token_ids for g in Engine(smollm).generate(requests)]
    adaptive = Engine(smollm, method, config, adaptive=True)
    assert [g.token_ids for g in adaptive.generate(requests)] == plain
    assert [adaptive.generate([r])[0].token_ids for r in requests[:2]] == plain[:2]
    streamed, finished, _ = staggered(
        ContinuousBatcher(adaptive, max_rows=3), requests, first=4, later_step=3
    )
    assert [streamed[i] for i in range(len(requests))] == plain
    assert [finished[i].token_ids for i in range(len(requests))] == plain
    ak = adaptive.adaptive
    assert ak is not None and ak.steps > 0 and ak.acceptance.p  # it chose caps and learnt from them


class CapSchedule(AdaptiveK):
    """Adaptive k whose caps follow a fixed cycle instead of the goodput model."""

    def __init__(self, k_max: int, caps: list[int]) -> None:
        super().__init__(k_max=k_max)
        self.cycle = itertools.cycle(caps)

    def choose(self, rows: int, active: int) -> int:
        return next(self.cycle)


def test_eagle_drafts_again_after_steps_that_drafted_nothing(smollm, prompts) -> None:
    # Steps capped at 0 leave the head's queued entries to the next step that drafts, which
    # runs them through the head as one block: the drafts then are the head's usual ones.
    engine = Engine(smollm, "eagle", ProposerConfig(k=3, head="builtin:eagle"), adaptive=True)
    engine.adaptive = CapSchedule(k_max=3, caps=[0, 0, 0, 3])
    requests = [Request(p, max_new_tokens=40) for p in prompts[:3]]
    plain = [g.token_ids for g in Engine(smollm).generate(requests)]
    generations = engine.generate(requests)
    assert [g.token_ids for g in generations] == plain
    assert sum(g.metrics.accepted_tokens for g in generations) > 0


def test_adaptive_k_is_refused_where_the_draft_size_is_fixed(smollm) -> None:
    with pytest.raises(SpecError, match="adaptive k does not apply to lookahead"):
        Engine(smollm, "lookahead", ProposerConfig(k=3), adaptive=True)


@pytest.mark.parametrize(
    ("method", "config"),
    [
        ("eagle", ProposerConfig(k=3, head="builtin:eagle")),
        pytest.param("draft_model", ProposerConfig(k=3, draft="self:8"), marks=pytest.mark.long),
    ],
    ids=["eagle", "draft_model"],
)
def test_a_long_prompt_joins_rows_that_have_run_long(smollm, prompts, method, config) -> None:
    """The draft's own cache takes a joining row's whole prompt in one block beside rows far
    into their output: it grows to hold both, and the drafts stay each row's own."""
    engine = Engine(smollm, method, config)
    first, second = (smollm.encode_prompt(" ".join(TEXTS[i:] * 6), chat=True) for i in (0, 1))
    requests = [Request(first, max_new_tokens=32), Request(second, max_new_tokens=8)]
    solo = [engine.generate([r])[0].token_ids for r in requests]
    streamed, _, _ = staggered(ContinuousBatcher(engine, max_rows=4), requests, first=1, later_step=12)
    assert [streamed[0], streamed[1]] == solo


def test_joining_prompts_are_prefilled_in_groups_of_similar_length() -> None:
    lengths = [69, 47, 35, 46, 47, 57, 51, 269, 35, 270]
    groups = prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        short, long = min(lengths[i] for i in group), max(lengths[i] for i in group)
        assert long <= short * PREFILL_SLACK + PREFILL_PAD
    # the two long prompts share a group, apart from the short ones
    assert sorted(next(g for g in groups if 7 in g)) == [7, 9]
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded < 1.2 * sum(lengths) < len(lengths) * max(lengths)
