"""The benchmark-runner's measurement on the real model: reps, speedups, summaries, resume, failures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import pytest

from speccore.model_cache import ModelCache
from specops_schemas.api import Target
from specops_schemas.candidates import BASELINE_ID, Candidate
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import BenchPlan, RepMetrics
from specops_services.benchmark_runner.measure import TargetLoadError, measure
from specops_services.benchmark_runner.protocol import BenchOutcome, RepRow, summarise

MODEL = "smollm2-135m-instruct"
NGRAM = Candidate(candidate_id="ngram-k4", family="ngram", k=4)
SELF6 = Candidate(candidate_id="self6", family="draft_model", draft="self:6", k=4)


def _plan(candidates: list[Candidate], *, model: str = MODEL, n_prompts: int = 2, new: int = 16) -> BenchPlan:
    return BenchPlan(
        run_id="run-1",
        target=Target(model_ref=model, gpu="cpu", engine="speccore"),
        fingerprint="chat",
        mode="interactive",
        quality_gate="topk5",
        candidates=candidates,
        reps=1,
        n_prompts=n_prompts,
        max_new_tokens=new,
    )


def _run(
    plan: BenchPlan, cache: ModelCache, done: Sequence[RepRow] = ()
) -> tuple[list[RepRow], BenchOutcome]:
    calls: list[RepRow] = []
    outcome = measure(
        plan,
        model_cache=cache,
        on_rep=calls.append,
        done=done,
        device="cpu",
        dtype="float32",
    )
    return calls, outcome


def _no_load(ref: str, device: str, dtype: str):
    raise AssertionError("the model should not be loaded")


@pytest.fixture(scope="module")
def cache(smollm) -> ModelCache:
    return ModelCache(loader=lambda ref, device, dtype: smollm)


@pytest.fixture(scope="module")
def first(cache) -> tuple[list[RepRow], BenchOutcome]:
    return _run(_plan([NGRAM, SELF6]), cache)


@pytest.mark.slow
def test_one_callback_per_method_and_rep_baseline_first(first) -> None:
    calls, _ = first
    assert [(c.candidate_id, c.rep) for c in calls] == [(BASELINE_ID, 0), ("ngram-k4", 0), ("self6", 0)]
    base = calls[0].metrics
    assert base.drafted_tokens == 0 and base.mean_acceptance_length == 1.0
    # Greedy speculation is lossless: every method generated the same tokens.
    assert {c.metrics.new_tokens for c in calls} == {base.new_tokens}
    assert 0 < base.new_tokens <= 2 * 16


@pytest.mark.slow
def test_speedups_are_ratios_to_the_baseline_of_the_same_rep(first) -> None:
    calls, _ = first
    base = calls[0]
    assert base.speedup is None
    for call in calls[1:]:
        assert call.speedup == pytest.approx(call.metrics.tokens_per_s / base.metrics.tokens_per_s)
        assert call.metrics.tokens_per_s == pytest.approx(call.metrics.new_tokens / call.metrics.total_time_s)


@pytest.mark.slow
def test_summaries_are_the_rep_rows_summarised(first) -> None:
    calls, outcome = first
    assert outcome.failures == []
    assert outcome.baseline == summarise([calls[0]])
    assert outcome.results == [summarise([c]) for c in calls[1:]]
    ngram = outcome.results[0]
    assert ngram.candidate_id == "ngram-k4" and ngram.reps == 1
    assert ngram.speedup == pytest.approx(calls[1].speedup)
    assert ngram.acceptance_rate == pytest.approx(calls[1].metrics.acceptance_rate)
    assert outcome.baseline.speedup == 1.0


@pytest.mark.slow
def test_stored_reps_are_skipped_and_still_summarised(first, cache) -> None:
    calls, outcome = first
    stored = [calls[0], calls[2]]  # the baseline and self6 reps made it to the database, ngram's did not
    resumed_calls, resumed = _run(_plan([NGRAM, SELF6]), cache, done=stored)
    assert [(c.candidate_id, c.rep) for c in resumed_calls] == [("ngram-k4", 0)]
    assert resumed.baseline == outcome.baseline
    assert resumed.results == [summarise(resumed_calls), outcome.results[1]]


def test_a_finished_bench_is_summarised_without_loading_the_model() -> None:
    rows = [_row(BASELINE_ID, 0, 10.0, None), _row("ngram-k4", 0, 15.0, 1.5)]
    calls, outcome = _run(_plan([NGRAM]), ModelCache(loader=_no_load), done=rows)
    assert calls == []
    assert outcome.results == [summarise(rows[1:])]


@pytest.mark.slow
def test_a_candidate_that_cannot_load_fails_alone(cache) -> None:
    bogus = Candidate(candidate_id="bogus", family="draft_model", draft="/nonexistent/draft-model", k=4)
    medusa = Candidate(candidate_id="medusa", family="medusa", draft="/nonexistent/heads-1", k=3)
    mtp = Candidate(candidate_id="mtp", family="mtp", k=2)
    tree = Candidate(candidate_id="tree", family="ngram", k=3, tree=[2, 1])
    typo = Candidate(candidate_id="typo", family="ngram", k=3, options={"ngram_mx": 3})
    calls, outcome = _run(_plan([bogus, NGRAM, medusa, mtp, tree, typo], n_prompts=1, new=8), cache)
    assert [c.candidate_id for c in calls] == [BASELINE_ID, "ngram-k4"]
    assert [m.candidate_id for m in outcome.results] == ["ngram-k4"]
    failures = {f.candidate_id: f for f in outcome.failures}
    assert list(failures) == ["bogus", "medusa", "mtp", "tree", "typo"]
    assert {failures[c].error_stage for c in ("bogus", "medusa")} == {ErrorStage.MODEL_LOAD}
    assert "/nonexistent/draft-model" in failures["bogus"].message
    assert "/nonexistent/heads-1" in failures["medusa"].message
    assert {failures[c].error_stage for c in ("mtp", "tree", "typo")} == {ErrorStage.VALIDATION}
    assert "ngram_mx" in failures["typo"].message


def test_an_unloadable_target_is_a_model_load_error() -> None:
    with pytest.raises(TargetLoadError, match="/nonexistent/target") as err:
        _run(_plan([NGRAM], model="/nonexistent/target"), ModelCache())
    assert err.value.error_stage == ErrorStage.MODEL_LOAD


def test_model_cache_loads_each_target_once_and_drops_the_least_recent() -> None:
    loads: list[str] = []

    def loader(ref: str, device: str, dtype: str):
        loads.append(ref)
        return object()

    cache = ModelCache(capacity=2, loader=loader)
    a = cache.get("a")
    cache.get("b")
    assert cache.get("a") is a  # "a" is now the most recent
    cache.get("c")  # drops "b"
    cache.get("a")
    cache.get("b")
    assert loads == ["a", "b", "c", "b"]
    assert len(cache) == 2


def _row(cid: str, rep: int, tps: float, speedup: float | None, **fields) -> RepRow:
    values = {
        "prompt_tokens": 100,
        "new_tokens": 32,
        "verify_steps": 16,
        "drafted_tokens": 0,
        "accepted_tokens": 0,
        "rollbacks": 0,
        "draft_time_s": 0.0,
        "verify_time_s": 1.0,
        "ttft_s": 0.1,
        "total_time_s": 32 / tps,
        "extra_memory_bytes": 0,
        "drafted_per_position": [],
        "accepted_per_position": [],
        "acceptance_rate": 0.0,
        "mean_acceptance_length": 1.0,
        "per_position_acceptance": [],
        "tpot_s": 0.05,
        "tokens_per_s": tps,
    } | fields
    return RepRow(cid, rep, RepMetrics(**values), speedup)


def test_summarise_pools_counts_and_takes_the_median_speedup() -> None:
    rows = [
        _row("c", 2, 30.0, 2.0, drafted_tokens=8, accepted_tokens=6, verify_steps=10, ttft_s=0.3,
             drafted_per_position=[4, 4], accepted_per_position=[4, 2], extra_memory_bytes=5),
        _row("c", 0, 10.0, 1.0, drafted_tokens=4, accepted_tokens=1, verify_steps=6, ttft_s=0.1,
             drafted_per_position=[4], accepted_per_position=[1], extra_memory_bytes=9),
        _row("c", 1, 20.0, 1.2, verify_steps=4, ttft_s=0.2),
    ]  # fmt: skip
    m = summarise(rows)
    assert m.reps == 3
    assert m.tokens_per_s == pytest.approx(20.0)
    assert m.tokens_per_s_stdev == pytest.approx(statistics.stdev([10.0, 20.0, 30.0]))
    assert m.speedup == pytest.approx(1.2)
    assert m.speedup_mean == pytest.approx((2.0 + 1.0 + 1.2) / 3)
    assert m.speedup_stdev == pytest.approx(statistics.stdev([2.0, 1.0, 1.2]))
    assert m.acceptance_rate == pytest.approx(7 / 12)
    assert m.mean_acceptance_length == pytest.approx((7 + 20) / 20)
    assert m.per_position_acceptance == pytest.approx([5 / 8, 2 / 4])
    assert m.ttft_s == pytest.approx(0.2)
    assert m.extra_memory_bytes == 9


def test_summarise_refuses_mixed_or_repeated_rows() -> None:
    with pytest.raises(ValueError, match="different candidates"):
        summarise([_row("a", 0, 1.0, 1.0), _row("b", 1, 1.0, 1.0)])
    with pytest.raises(ValueError, match="repeat"):
        summarise([_row("a", 0, 1.0, 1.0), _row("a", 0, 1.0, 1.0)])
    baseline = summarise([_row(BASELINE_ID, 0, 7.0, None)])
    assert (baseline.speedup, baseline.speedup_mean, baseline.speedup_stdev) == (1.0, None, None)
    one_rep = summarise([_row("a", 0, 7.0, 1.5)])
    assert (one_rep.speedup_mean, one_rep.speedup_stdev) == (1.5, 0.0)
