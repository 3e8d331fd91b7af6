"""The tuner's pure parts: the search space, the auto-termination rule, the trial verdicts."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops_schemas.api import Priorities, RunCreateRequest
from specops_schemas.candidates import BASELINE_ID, Candidate, CandidateResult, GateOutcome, Measurement
from specops_schemas.catalog import Engine, ErrorStage, GateMethod
from specops_schemas.engine_flags import engine_config
from specops_schemas.events import BenchCompleted, BenchPlan, CandidateFailure
from specops_schemas.tune import TrialResult, TuneRequested, TuneSessionCreateRequest
from specops_services.predictor.plan import HostInfo, plan_run
from specops_services.tuner import logic, rule
from specops_services.tuner import space as search

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _table(
    fingerprint: str = "code", target: dict[str, str] | None = None
) -> tuple[RunCreateRequest, list[CandidateResult], list[str]]:
    request = RunCreateRequest.model_validate(
        {
            "target": target or {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": fingerprint},
        }
    )
    plan = plan_run(request, run_id="run-1", host=HostInfo(cuda=False))
    rows = [CandidateResult(candidate=r.candidate, prediction=r.prediction) for r in plan.ranked]
    return request, rows, plan.pareto_front


def _requested(
    request: RunCreateRequest, rows: list[CandidateResult], front: list[str], winner: CandidateResult | None
) -> TuneRequested:
    """Session s1's tune.requested on run-1's table."""
    return TuneRequested(
        session_id="s1",
        request=TuneSessionCreateRequest(run_id="run-1"),
        run_request=request,
        run_candidates=rows,
        run_pareto_front=front,
        run_winner=winner,
        requested_by="token",
    )


class _Pick:
    """An Optuna trial stand-in that picks at random (seeded)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.rng.choice(list(choices))


# --- space ---------------------------------------------------------------------------------------


def test_space_spans_the_families_drafts_k_trees_and_knobs_of_the_t1_table() -> None:
    _, rows, _ = _table()
    space = search.build(rows)
    families = space.choices("family")
    assert set(families) == {str(r.candidate.family) for r in rows}
    assert space.choices("ngram.k") == list(range(1, 17))  # 2 x the largest k seen (8), at most 16
    assert space.choices("ngram.ngram_min") == [1, 2, 3]
    assert space.choices("eagle.tree")[0] == search.CHAIN and "4x2x1" in space.choices("eagle.tree")
    assert "ngram.tree" not in space.names()  # ngram takes no tree
    assert set(space.choices("draft_model.draft")) == {"self:7", "self:15"}
    only = search.build(rows, allowed=["ngram"])
    assert only.choices("family") == ["ngram"] and all(d.family in (None, "ngram") for d in only.dimensions)


def test_every_t1_candidate_round_trips_through_the_space() -> None:
    _, rows, _ = _table()
    space = search.build(rows)
    for row in rows:
        c = row.candidate
        params = search.to_params(c, space)
        assert params is not None, c.candidate_id
        back = search.to_candidate(params, space, trial=7)
        assert (back.family, back.draft, back.k, back.tree) == (c.family, c.draft, c.k, c.tree)
        assert back.candidate_id.startswith("t7-")


def test_suggestions_are_conditional_on_the_family_and_give_distinct_ids_per_trial() -> None:
    _, rows, _ = _table()
    space = search.build(rows)
    ids = set()
    for n in range(50):
        params = search.suggest(_Pick(n), space)
        family = params["family"]
        assert all(name == "family" or name.startswith(f"{family}.") for name in params)
        if params.get(f"{family}.tree", search.CHAIN) != search.CHAIN:
            assert f"{family}.k" not in params  # a tree's depth is its k
        cand = search.to_candidate(params, space, trial=n)
        assert search.infeasible(cand) is None  # the built-in grids never conflict
        ids.add(cand.candidate_id)
    assert len(ids) == 50


def test_a_vllm_session_searches_only_what_vllm_runs_and_every_trial_renders_its_flags() -> None:
    request, rows, front = _table(
        target={"model_ref": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100", "engine": "vllm"}
    )
    space = logic.space_of(_requested(request, rows, front, winner=None))
    assert {"ngram", "suffix"} <= set(space.choices("family"))
    # vLLM drafts a path: suffix's greedy tree and static trees are not searched.
    assert space.choices("suffix.use_tree_spec") == [0]
    assert all(space.choices(d.name) == [search.CHAIN] for d in space.dimensions if d.name.endswith(".tree"))
    assert space.choices("suffix.suffix_decoding_max_spec_factor") == [0.5, 1.0, 2.0]
    # The same table on speccore searches the tree too.
    assert search.build(rows).choices("suffix.use_tree_spec") == [0, 1]
    for n in range(40):
        cand = search.to_candidate(search.suggest(_Pick(n), space), space, trial=n)
        _, args = engine_config(cand, Engine.VLLM)  # EngineCannotRun if vLLM would refuse it
        body = json.loads(args[1])
        assert body["num_speculative_tokens"] == cand.k
        if cand.family == "ngram":
            assert body["prompt_lookup_min"] <= body["prompt_lookup_max"]


def test_conflicting_knobs_are_infeasible() -> None:
    bad = Candidate(candidate_id="t1-ngram", family="ngram", k=4, options={"ngram_min": 5, "ngram_max": 3})
    reason = search.infeasible(bad)
    assert reason is not None and "ngram_min" in reason


def test_seeds_are_the_pareto_points_then_the_winner_once_each() -> None:
    request, rows, front = _table()
    space = search.build(rows)
    winner = next(r for r in rows if r.candidate.candidate_id == front[0])
    seeds = logic.seeds(_requested(request, rows, front, winner), space)
    assert len(seeds) == len(front)  # the winner is on the front already
    assert seeds[0] == search.to_params(winner.candidate, space)


# --- rule -----------------------------------------------------------------------------------------


def _done(values: list[float], sigma: float = 0.05, seeded: int = 3) -> list[rule.Done]:
    return [rule.Done(trial=i, value=v, sigma=sigma, seeded=i < seeded) for i, v in enumerate(values)]


def test_a_plateau_fires() -> None:
    trials = _done([1.20, 1.25, 1.22, 1.21, 1.24, 1.23, 1.26])
    verdict = rule.check(trials)
    assert verdict.fired
    assert verdict.top3_start == pytest.approx((1.20 + 1.25 + 1.22) / 3)
    assert verdict.top3_now == pytest.approx((1.26 + 1.25 + 1.24) / 3)
    assert verdict.sigma == pytest.approx(0.05)


def test_a_steady_climber_does_not_fire() -> None:
    trials = _done([1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5], sigma=0.05)
    verdict = rule.check(trials)
    assert not verdict.fired
    assert verdict.top3_now - verdict.top3_start > verdict.sigma  # type: ignore[operator]


def test_sigma_is_the_rms_of_the_current_top3() -> None:
    trials = [
        rule.Done(0, 1.0, 0.0, True),
        rule.Done(1, 2.0, 0.3, False),
        rule.Done(2, 2.1, 0.4, False),
        rule.Done(3, 2.2, 0.0, False),
    ]
    assert rule.pooled_sigma(rule.best3(trials)) == pytest.approx(((0.09 + 0.16 + 0.0) / 3) ** 0.5)


def test_without_three_seeds_the_start_is_the_first_three_complete_trials() -> None:
    trials = _done([1.0, 1.1, 1.2, 2.0], seeded=1)
    assert rule.top3_start(trials) == pytest.approx(1.1)


def test_too_few_trials_do_not_fire() -> None:
    verdict = rule.check(_done([1.2, 1.2]))
    assert not verdict.fired and verdict.top3_now is None


def test_the_rule_is_due_once_at_80_percent() -> None:
    assert not rule.due(79.0, 100.0, checked=False)
    assert rule.due(80.0, 100.0, checked=False)
    assert not rule.due(95.0, 100.0, checked=True)


# --- trial verdicts ---------------------------------------------------------------------------------


def _m(cid: str, speedup: float, stdev: float | None = 0.02) -> Measurement:
    return Measurement(
        candidate_id=cid,
        reps=3,
        tokens_per_s=10 * speedup,
        tokens_per_s_stdev=0.1,
        speedup=speedup,
        speedup_mean=speedup if cid != BASELINE_ID else None,
        speedup_stdev=stdev if cid != BASELINE_ID else None,
        acceptance_rate=0.5,
        mean_acceptance_length=1.5,
        per_position_acceptance=[0.5],
        ttft_s=0.05,
        tpot_s=0.1 / speedup,
        extra_memory_bytes=0,
    )


def _trial(n: int = 0) -> logic.Trial:
    cand = Candidate(candidate_id=f"t{n}-ngram-k4", family="ngram", k=4)
    result = TrialResult(
        trial=n,
        bench_id=logic.bench_id_for("s1", n),
        candidate=cand,
        params={},
        seeded=False,
        state="running",
        started_at=NOW,
    )
    return logic.Trial(result)


def test_bench_ids_are_derived_from_session_and_trial() -> None:
    assert logic.bench_id_for("s1", 3) == logic.bench_id_for("s1", 3)
    assert len({logic.bench_id_for("s1", n) for n in range(5)} | {logic.bench_id_for("s2", 0)}) == 6


def test_a_trial_completes_once_measured_and_passed() -> None:
    trial = _trial()
    cid = trial.result.candidate.candidate_id
    m = _m(cid, 1.5)
    measured = logic.Trial(logic.with_measurement(trial.result, m), _m(BASELINE_ID, 1.0))
    prio = Priorities(throughput=0.7, latency=0.3)
    assert logic.ending(measured, GateMethod.TOPK5, prio) is None  # no verdict yet
    gated = logic.Trial(
        measured.result.model_copy(
            update={"gate": GateOutcome(method=GateMethod.TOPK5, passed=True, score=1.0, threshold=0.95)}
        ),
        measured.baseline,
    )
    how = logic.ending(gated, GateMethod.TOPK5, prio)
    assert how is not None and how.value == pytest.approx(prio.measured_score(m, measured.baseline))
    assert logic.ending(measured, GateMethod.SKIPPED, prio) is not None


def test_a_failed_gate_is_a_failed_trial_with_its_numbers() -> None:
    trial = _trial()
    m = _m(trial.result.candidate.candidate_id, 1.5)
    gate = GateOutcome(method=GateMethod.TOPK5, passed=False, score=0.6, threshold=0.95)
    gated = logic.Trial(
        logic.with_measurement(trial.result, m).model_copy(update={"gate": gate}), _m(BASELINE_ID, 1.0)
    )
    how = logic.ending(gated, GateMethod.TOPK5, Priorities(throughput=1.0))
    assert how is not None and how.value is None and how.stage == ErrorStage.QUALITY_REGRESSION
    assert "0.6" in (how.message or "") and "0.95" in (how.message or "")
    failed = logic.ended(gated.result, how, NOW)
    assert failed.state == "failed" and failed.value is None


def test_a_candidate_failure_fails_the_trial() -> None:
    trial = _trial()
    plan = BenchPlan.model_validate(
        {
            "run_id": "s1",
            "target": {"model_ref": "m", "gpu": "cpu", "engine": "speccore"},
            "fingerprint": "code",
            "mode": "interactive",
            "quality_gate": "topk5",
            "candidates": [trial.result.candidate.model_dump()],
            "reps": 2,
            "n_prompts": 1,
            "max_new_tokens": 8,
        }
    )
    cid = trial.result.candidate.candidate_id
    done = BenchCompleted(
        bench_id=trial.result.bench_id,
        plan=plan,
        baseline=_m(BASELINE_ID, 1.0),
        results=[],
        failures=[CandidateFailure(candidate_id=cid, error_stage=ErrorStage.MODEL_LOAD, message="no head")],
    )
    how = logic.measured(trial, done)
    assert isinstance(how, logic.Ending) and how.stage == ErrorStage.MODEL_LOAD


def test_the_winner_must_beat_the_baseline_and_states_what_was_measured() -> None:
    trial = _trial()
    slow = logic.ended(logic.with_measurement(trial.result, _m("x", 0.9)), logic.Ending(value=0.9), NOW)
    assert logic.winner(slow) is None
    fast = logic.ended(logic.with_measurement(trial.result, _m("x", 1.4)), logic.Ending(value=1.3), NOW)
    won = logic.winner(fast)
    assert won is not None and won.prediction.rank == 1 and won.prediction.speedup == 1.4
    assert won.prediction.score == 1.3 and won.measurement is not None


def test_downtime_is_a_gap_over_three_ticks() -> None:
    assert logic.downtime_gap(NOW, NOW + timedelta(seconds=14), tick_s=5.0) == 0.0
    assert logic.downtime_gap(NOW, NOW + timedelta(seconds=40), tick_s=5.0) == 40.0


def test_the_bench_samples_as_the_t1_plan_did() -> None:
    request, rows, front = _table("chat")
    requested = TuneRequested(
        session_id="s1",
        request=TuneSessionCreateRequest(run_id="run-1", reps=4, seed=9),
        run_request=request,
        run_candidates=rows,
        run_pareto_front=front,
        run_winner=None,
        requested_by="token",
    )
    plan = logic.bench_plan("s1", requested, rows[0].candidate, logic.BenchSize(3, 3, 48))
    assert plan.run_id == "s1" and plan.reps == 4 and plan.seed == 9 and plan.sampling.temperature == 0.7
    assert plan.candidates == [rows[0].candidate]


def test_importances_single_out_the_dimension_that_matters() -> None:
    import optuna

    from specops_services.tuner import study

    _, rows, _ = _table()
    space = search.build(rows, allowed=["ngram"])
    sampler = optuna.samplers.RandomSampler(seed=1)
    local = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(60):
        trial = local.ask()
        params = search.suggest(trial, space)
        # Only k matters: the value climbs with it, whatever the n-gram window.
        local.tell(trial, 1.0 + 0.1 * int(params["ngram.k"]))
    found = study.importances_of(local.get_trials(), "ngram", space)
    assert set(found) == {"ngram.k", "ngram.ngram_min", "ngram.ngram_max"}  # draft has one choice
    assert max(found, key=lambda n: found[n]) == "ngram.k"
    best = max(local.get_trials(), key=lambda t: t.value).params
    dropped = logic.narrowed(found, best, threshold=0.05)
    # PED-ANOVA looks at the top 10 %: an irrelevant window can still look important by chance,
    # but one that clearly does not matter is fixed at the best trial's value.
    assert "ngram.k" not in dropped and dropped == {"ngram.ngram_max": best["ngram.ngram_max"]}
