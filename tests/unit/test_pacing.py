"""F-S2's paced release (speccore.pacing): the schedule it computes, on a clock the test
gives, whatever the bursts the engine delivers."""

from __future__ import annotations

import pytest

from speccore.pacing import PaceClock, Pacer, Release


def test_bursts_leave_one_token_per_interval_from_the_first() -> None:
    pacer = Pacer(0.04)
    pacer.push(0, [1, 2, 3], None, available_at=10.0)  # a step that accepted 2 drafts
    pacer.push(0, [4], None, available_at=10.03)  # one that accepted none
    pacer.push(0, [5, 6, 7, 8], "length", available_at=10.05)
    released = pacer.due(100.0)
    assert [r.token for r in released] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r.at for r in released] == pytest.approx([10.0 + 0.04 * i for i in range(8)])
    assert [r.finish_reason for r in released] == [None] * 7 + ["length"]
    assert pacer.slips == 0


def test_the_schedule_does_not_depend_on_how_the_tokens_were_grouped() -> None:
    """The same 6 tokens, delivered as 1+5 or 3+3 or one at a time (all before their slot),
    leave at the same times: burst sizes do not show."""

    def schedule(bursts: list[tuple[float, list[int]]]) -> list[float]:
        pacer = Pacer(0.05)
        for i, (at, tokens) in enumerate(bursts):
            pacer.push(0, tokens, "stop" if i == len(bursts) - 1 else None, at)
        return [r.at for r in pacer.due(1e9)]

    a = schedule([(1.0, [1]), (1.02, [2, 3, 4, 5, 6])])
    b = schedule([(1.0, [1, 2, 3]), (1.03, [4, 5, 6])])
    c = schedule([(1.0 + 0.01 * i, [i]) for i in range(6)])
    assert a == b == c == pytest.approx([1.0 + 0.05 * i for i in range(6)])


def test_a_token_late_for_its_slot_waits_for_the_next_slot_on_the_grid() -> None:
    clock = PaceClock(0.04)
    assert clock.slot(1.0) == 1.0
    assert clock.slot(1.01) == pytest.approx(1.04)  # waits for its slot
    assert clock.slot(1.1) == pytest.approx(1.12)  # missed 1.08: the next slot, not 1.1
    assert clock.slot(1.1) == pytest.approx(1.16)
    assert clock.slips == 1


def test_only_due_releases_leave_and_choices_keep_their_own_clocks() -> None:
    pacer = Pacer(0.1, choices=2)
    pacer.push(1, [7, 8], None, available_at=5.0)
    pacer.push(0, [3], None, available_at=5.05)
    assert pacer.next_at == 5.0
    assert pacer.due(5.06) == [Release(5.0, 1, 7), Release(5.05, 0, 3)]
    assert pacer.next_at == pytest.approx(5.1)
    assert pacer.due(5.09) == []
    assert [(r.index, r.token) for r in pacer.due(5.1)] == [(1, 8)]
    assert pacer.next_at is None


def test_an_end_without_tokens_takes_a_slot() -> None:
    pacer = Pacer(0.04)
    pacer.push(0, [1, 2], None, available_at=0.0)
    pacer.push(0, [], "stop", available_at=0.01)  # the finishing step kept nothing (a stop string)
    assert pacer.due(1.0)[-1] == Release(pytest.approx(0.08), 0, None, "stop")


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PaceClock(0.0)
