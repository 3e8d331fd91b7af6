"""Adaptive k's chooser (speccore.adaptive) on given cost curves and acceptances.

The costs are made-up seconds shaped like this CPU's (a block of up to ~8 tokens costs about
one token, wider blocks grow linearly), fed through the same observe calls the engine makes.
"""

from __future__ import annotations

import pytest

from speccore.adaptive import Acceptance, AdaptiveK, DraftCost, StepCost, bucket


def cpu_like(tokens: int) -> float:
    """Seconds of a verify step over ``tokens`` block tokens: flat to 8, then linear."""
    return 0.02 * max(1.0, tokens / 8)


def trained(k_max: int, accept: float, *, draft_per_node: float = 0.0) -> AdaptiveK:
    """An AdaptiveK that has seen every block size up to 32 rows x (1 + k_max) and the
    acceptance ``accept`` at every position."""
    ak = AdaptiveK(k_max=k_max)
    for rows in (1, 2, 4, 8, 16, 32):
        for cap in range(k_max + 1):
            ak.cost.observe(rows * (1 + cap), cpu_like(rows * (1 + cap)))
    for cap in range(k_max + 1):
        ak.draft.observe(cap, propose_s=draft_per_node * cap, observe_s=0.0)
    for _ in range(200):
        ak.acceptance.p = [accept] * k_max
    return ak


def test_batch_one_with_high_acceptance_drafts_the_most() -> None:
    assert trained(5, 0.8).best(rows=1, active=1) == 5


def test_a_heavy_batch_with_low_acceptance_drafts_nothing() -> None:
    assert trained(5, 0.2).best(rows=32, active=32) == 0


def test_the_cap_shrinks_as_the_batch_grows() -> None:
    ak = trained(5, 0.7)
    caps = [ak.best(rows=b, active=b) for b in (1, 2, 4, 8, 16, 32)]
    assert caps == sorted(caps, reverse=True)
    assert caps[0] == 5 and caps[-1] < 5


def test_an_expensive_draft_is_drafted_less() -> None:
    cheap = trained(5, 0.6).best(rows=1, active=1)
    costly = trained(5, 0.6, draft_per_node=0.02).best(rows=1, active=1)
    assert costly < cheap


def test_never_predicts_less_goodput_than_plain_decoding() -> None:
    for accept in (0.0, 0.3, 0.9):
        ak = trained(5, accept)
        for b in (1, 8, 32):
            assert ak.goodput(b, b, ak.best(b, b)) >= ak.goodput(b, b, 0)


def test_acceptance_per_position_from_step_outcomes() -> None:
    acc = Acceptance(alpha=1.0)  # no memory: the last step's rates
    # four rows drafted 3 deep: accepted 0, 1, 3, 3 -> p0 = 3/4, p1 = 2/3, p2 = 2/2
    acc.observe([(3, 0), (3, 1), (3, 3), (3, 3)])
    assert acc.p == pytest.approx([0.75, 2 / 3, 1.0])
    assert acc.expected_tokens(3) == pytest.approx(1 + 0.75 + 0.5 + 0.5)
    # a row that drafted nothing under a positive cap is a rejection at position 0
    acc.observe([(0, 0)])
    assert acc.p[0] == 0.0


def test_step_cost_interpolates_and_never_falls_with_more_tokens() -> None:
    cost = StepCost()
    cost.observe(4, 1.0)
    cost.observe(64, 3.0)
    assert cost(4) == pytest.approx(1.0)
    assert cost(34) == pytest.approx(2.0)  # halfway between the two measured points
    assert cost(128) > cost(64) > cost(8) > cost(2)
    cost.observe(16, 0.5)  # noise: a wider block measured cheaper
    assert cost(16) >= cost(4)
    assert bucket(1) == 0 and bucket(2) == 1 and bucket(4) == 2 and bucket(5) == 3


def test_draft_cost_scales_from_the_nearest_measured_cap() -> None:
    draft = DraftCost()
    draft.observe(0, propose_s=0.001, observe_s=0.002)
    draft.observe(2, propose_s=0.010, observe_s=0.002)
    assert draft(4) == pytest.approx(0.022)
    assert draft(0) == pytest.approx(0.003)


def test_a_slow_first_step_at_cap_0_does_not_keep_the_chooser_drafting() -> None:
    # The first step after a join ran at cap 0 and took 0.16 s (kernel set-up); every later
    # step ran at cap 1 and read its outcome in 1 ms.
    ak = trained(4, 0.1)
    ak.draft = DraftCost()
    ak.draft.observe(0, propose_s=0.0, observe_s=0.16)
    for _ in range(30):
        ak.draft.observe(1, propose_s=0.006, observe_s=0.001)
    assert ak.draft(0) < ak.draft(1) < 0.01
    assert ak.best(rows=32, active=32) == 0
    ak.draft.observe(0, propose_s=0.05, observe_s=0.001)  # a stale slow propose at cap 0
    assert ak.draft(0) <= ak.draft(1)


def test_exploration_returns_to_k_max_now_and_then_and_a_recovered_draft_is_picked_again() -> None:
    ak = trained(4, 0.05)
    caps = [ak.choose(rows=32, active=32) for _ in range(2000)]
    explored = caps.count(4)
    assert caps.count(0) > 0.95 * len(caps)
    assert 1 <= explored <= 0.05 * len(caps)
    # the draft recovers: the outcomes the exploring steps see lift the estimates
    for _ in range(50):
        ak.acceptance.observe([(4, 4)] * 32)
    assert ak.choose(rows=1, active=1) == 4
