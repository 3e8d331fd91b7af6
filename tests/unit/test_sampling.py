"""The distribution a request samples from: temperature, top-k, top-p, greedy."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from speccore.errors import SpecError
from speccore.sampling import SamplingParams, ban_early_stops, probs_from_logits, sample


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs])


def test_greedy_is_one_hot_argmax_per_row() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 4.99]])
    probs = probs_from_logits(logits, SamplingParams())
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_temperature_one_is_plain_softmax_and_lower_temperature_sharpens() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(temperature=1.0)), logits.softmax(-1))
    cold = probs_from_logits(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(cold, (logits / 0.5).softmax(-1))
    hot = probs_from_logits(logits, SamplingParams(temperature=2.0))
    assert (cold.max(-1).values > logits.softmax(-1).max(-1).values).all()
    assert (hot.max(-1).values < logits.softmax(-1).max(-1).values).all()


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_the_k_most_likely_tokens(k: int) -> None:
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(k))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=k))
    kept = probs > 0
    assert kept.sum(-1).tolist() == [k] * 4
    top = logits.topk(k, dim=-1).indices
    assert kept.gather(-1, top).all()
    # The survivors keep their relative odds.
    torch.testing.assert_close(probs.gather(-1, top), logits.gather(-1, top).softmax(-1))


def test_top_k_at_least_vocab_size_changes_nothing() -> None:
    logits = torch.randn(10, generator=torch.Generator().manual_seed(1))
    full = probs_from_logits(logits, SamplingParams(temperature=1.0))
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=10)), full)
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=99)), full)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.05, [0]),  # the most likely token alone already reaches p
        (0.45, [0]),
        (0.75, [0, 1]),  # 0.5 < 0.75 <= 0.5 + 0.3
        (0.85, [0, 1, 2]),
        (0.97, [0, 1, 2, 3]),
        (1.0, [0, 1, 2, 3]),
    ],
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p: float, kept: list[int]) -> None:
    base = [0.5, 0.3, 0.15, 0.05]
    order = [2, 0, 3, 1]  # vocab ids of the tokens above, so sorting has to be undone
    logits = torch.empty(4)
    logits[order] = _logits(base)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
    kept_ids = sorted(order[i] for i in kept)
    assert torch.nonzero(probs).flatten().tolist() == kept_ids
    mass = sum(base[i] for i in kept)
    torch.testing.assert_close(probs[[order[i] for i in kept]], torch.tensor([base[i] / mass for i in kept]))


def test_top_p_keeps_the_first_token_even_when_it_is_certain() -> None:
    probs = probs_from_logits(torch.tensor([0.0, 80.0, 0.0]), SamplingParams(temperature=1.0, top_p=0.01))
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_top_p_agrees_with_transformers_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 40, generator=gen) * 2
    for top_p in (0.3, 0.7, 0.9):
        ours = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0
        theirs = TopPLogitsWarper(top_p)(None, logits.clone()) > float("-inf")
        assert torch.equal(ours, theirs)


def test_top_p_is_applied_to_the_tempered_distribution() -> None:
    # At temperature 1 the top token holds 0.5 of the mass; tempered to 0.5 it holds 0.69.
    logits = _logits([0.5, 0.3, 0.2])
    assert (probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.6)) > 0).sum() == 2
    assert (probs_from_logits(logits, SamplingParams(temperature=0.5, top_p=0.6)) > 0).sum() == 1


def test_top_k_then_top_p() -> None:
    logits = _logits([0.4, 0.3, 0.2, 0.1])
    # After top-2 the survivors are 4/7 and 3/7; top-p 0.5 keeps only the first.
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
    ],
)
def test_bad_sampling_params_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(SpecError):
        SamplingParams(**kwargs)


def test_greedy_is_temperature_zero() -> None:
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5).greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_sample_follows_the_generator_seed() -> None:
    probs = torch.full((100,), 0.01)
    draws_a = [sample(probs, torch.Generator().manual_seed(7)) for _ in range(3)]
    gen = torch.Generator().manual_seed(7)
    draws_b = [sample(probs, gen) for _ in range(20)]
    assert len(set(draws_a)) == 1  # same seed, same first draw
    assert draws_b[0] == draws_a[0]
    assert len(set(draws_b)) > 1  # the generator advances
    assert sample(torch.tensor([0.0, 0.0, 1.0]), None) == 2


def test_min_p_drops_tokens_less_likely_than_min_p_times_the_likeliest() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0]).log()  # probabilities 0, 1/6, 2/6, 3/6
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.5))
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.0, 0.4, 0.6]))
    assert probs_from_logits(logits, SamplingParams(min_p=0.9)).argmax() == 3  # greedy: unchanged


def test_early_stops_are_banned_only_where_min_tokens_is_still_owed() -> None:
    logits = torch.zeros(4, 5)
    ban_early_stops(logits, [-1, 0, 1, 0], room=2, banned=[3, 4])  # depths 0, 1, 2, 1
    masked = torch.isinf(logits).any(-1).tolist()
    assert masked == [True, True, False, True]
    assert torch.isinf(logits[0, 3:]).all() and not torch.isinf(logits[0, :3]).any()
