"""speccore's measuring protocol with stand-in methods: order, warm-up, resume, failures."""

from __future__ import annotations

import pytest

from speccore.bench import BaselineFailed, Decoded, Method, RepRun, Schedule, interleave
from speccore.engine import Request

PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8]]


def _schedule(reps: int = 2, batch_size: int = 2) -> Schedule:
    return Schedule(prompts=PROMPTS, reps=reps, max_new_tokens=3, seed=10, batch_size=batch_size)


class _Log:
    """Every generate call of the stand-in methods, in the order they were made."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Request]]] = []

    def method(self, name: str, *, fail_on_call: int | None = None, tokens: int = 3) -> Method:
        def decode(requests: list[Request]) -> Decoded:
            self.calls.append((name, requests))
            if sum(1 for n, _ in self.calls if n == name) == fail_on_call:
                raise RuntimeError("boom\nsecond line")
            return Decoded([[r.prompt_ids[0]] * tokens for r in requests], [])

        return decode

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _measure(log: _Log, methods: dict[str, Method], schedule: Schedule | None = None, **kw):
    runs: list[RepRun] = []
    failures = interleave(schedule or _schedule(), methods, runs.append, baseline="base", **kw)
    return runs, failures


def test_warm_up_then_each_batch_in_an_order_rotating_with_rep_and_batch() -> None:
    log = _Log()
    runs, failures = _measure(log, {m: log.method(m) for m in ("base", "a", "b")})
    assert failures == {}
    assert log.names()[:3] == ["base", "a", "b"]
    warm = log.calls[0][1]
    assert [(r.prompt_ids, r.seed, r.max_new_tokens) for r in warm] == [([1, 2, 3], 10, 3)]
    batches = [log.names()[i : i + 3] for i in range(3, len(log.calls), 3)]
    # rep 0: batches 0, 1; rep 1: batches 0, 1
    assert batches == [["base", "a", "b"], ["a", "b", "base"], ["a", "b", "base"], ["b", "base", "a"]]
    # Every method decodes the same prompts with the same seeds (prompt i: seed + i).
    second_batch = {tuple((tuple(r.prompt_ids), r.seed) for r in requests) for _, requests in log.calls[6:9]}
    assert second_batch == {(((6,), 12), ((7, 8), 13))}
    assert [(r.method, r.rep) for r in runs] == [
        ("base", 0), ("a", 0), ("b", 0), ("base", 1), ("a", 1), ("b", 1)
    ]  # fmt: skip


def test_a_run_holds_its_rep_and_its_speedup_is_the_ratio_to_that_reps_baseline() -> None:
    log = _Log()
    runs, _ = _measure(log, {"base": log.method("base"), "a": log.method("a", tokens=2)})
    for rep in (0, 1):
        base, a = (r for r in runs if r.rep == rep)
        assert base.speedup is None
        assert a.token_ids == [[1, 1], [4, 4], [6, 6], [7, 7]] and a.new_tokens == 8
        assert a.seconds > 0 and a.speedup == pytest.approx(a.tokens_per_s / base.tokens_per_s)


def test_stored_reps_are_skipped_and_a_rep_with_work_left_reruns_the_baseline_unreported() -> None:
    log = _Log()
    stored = {("base", 0), ("a", 0), ("b", 0), ("base", 1), ("b", 1)}
    methods = {m: log.method(m) for m in ("base", "a", "b")}
    runs, _ = _measure(log, methods, stored=lambda m, r: (m, r) in stored)
    assert [(r.method, r.rep) for r in runs] == [("a", 1)]
    # Rep 0 is not run at all; rep 1 runs the baseline and a (after the warm-up).
    assert sorted(log.names()[3:]) == ["a", "a", "base", "base"]
    assert runs[0].speedup is not None


def test_a_failing_method_is_dropped_alone_with_its_error() -> None:
    log = _Log()
    methods = {"base": log.method("base"), "a": log.method("a", fail_on_call=3), "b": log.method("b")}
    runs, failures = _measure(log, methods)
    assert failures == {"a": "RuntimeError: boom"}
    assert list(methods) == ["base", "b"]  # dropped, so its memory can be freed
    assert [(r.method, r.rep) for r in runs] == [("base", 0), ("b", 0), ("base", 1), ("b", 1)]


def test_a_method_that_fails_its_warm_up_or_decodes_nothing_is_dropped() -> None:
    log = _Log()
    methods = {
        "base": log.method("base"),
        "a": log.method("a", fail_on_call=1),
        "b": log.method("b", tokens=0),
    }
    runs, failures = _measure(log, methods, _schedule(reps=1))
    assert failures == {"a": "RuntimeError: boom", "b": "generated no tokens in rep 0"}
    assert [r.method for r in runs] == ["base"]


@pytest.mark.parametrize(("fail_on_call", "tokens"), [(1, 3), (2, 3), (None, 0)])
def test_a_failing_baseline_ends_the_bench(fail_on_call: int | None, tokens: int) -> None:
    log = _Log()
    methods = {"base": log.method("base", fail_on_call=fail_on_call, tokens=tokens), "a": log.method("a")}
    with pytest.raises(BaselineFailed, match="the baseline"):
        _measure(log, methods)


def test_an_error_of_the_rep_callback_stops_the_bench() -> None:
    log = _Log()

    def stop(run: RepRun) -> None:
        raise KeyError("stop")

    with pytest.raises(KeyError):
        interleave(_schedule(), {"base": log.method("base")}, stop, baseline="base")
    assert len(log.calls) == 1 + 2  # warm-up and rep 0's two batches only
