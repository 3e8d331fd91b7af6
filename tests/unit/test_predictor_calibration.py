"""The calibrated predictor: the fit moves predictions towards what was measured, the scores
(Spearman, top-1) are computed right, and the predictor loads a calibration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Family, Fingerprint
from specops_services.predictor.calibration import (
    CalibrationRow,
    calibration_for,
    load_calibrations,
    write_calibration,
)
from specops_services.predictor.calibration_eval import evaluate, ranks, spearman, top1
from specops_services.predictor.calibration_set import (
    CalibrationPoint,
    calibration_point,
    fit,
    predicted_speedup,
    select,
)
from specops_services.predictor.plan import HostInfo, plan_run

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def points() -> dict[str, CalibrationPoint]:
    return {w: calibration_point(MODEL, w) for w in ("code", "structured", "rag")}


def pick(point: CalibrationPoint, prefix: str) -> Candidate:
    (found,) = select(point.candidates, [prefix])
    return found


def row(point: CalibrationPoint, prefix: str, speedup: float, mal: float) -> CalibrationRow:
    cand = pick(point, prefix)
    return CalibrationRow(
        workload=point.workload,
        fingerprint=point.serving.fingerprint,
        candidate=cand,
        speedup=speedup,
        mean_acceptance_length=mal,
        acceptance=(mal - 1.0) / cand.k,
    )


# --- the scores ---------------------------------------------------------------------------------


def test_spearman_is_one_for_any_increasing_relation_and_minus_one_reversed() -> None:
    xs = [0.9, 1.1, 1.3, 2.0, 5.0]
    assert spearman(xs, [x**3 for x in xs]) == pytest.approx(1.0)
    assert spearman(xs, [-x for x in xs]) == pytest.approx(-1.0)


def test_spearman_gives_ties_their_average_rank() -> None:
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # By hand: ranks x = 1, 2, 3, 4 and y = 1, 2.5, 2.5, 4 -> Pearson = 4.5 / sqrt(5 * 4.5).
    assert spearman([1, 2, 3, 4], [10, 20, 20, 40]) == pytest.approx(4.5 / (5 * 4.5) ** 0.5)


def test_top1_hits_within_five_percent_of_the_best_measured_and_misses_beyond() -> None:
    measured = {"a": 2.0, "b": 1.92, "c": 1.5}
    assert top1({"a": 1.0, "b": 3.0, "c": 2.0}, measured)["hit"]  # 1.92 >= 0.95 * 2.0
    miss = top1({"a": 1.0, "b": 1.0, "c": 3.0}, measured)
    assert not miss["hit"]
    assert (miss["predicted_best"], miss["measured_best"]) == ("c", "a")


# --- the fit ------------------------------------------------------------------------------------


def test_a_measured_shape_is_predicted_at_its_measured_speedup_and_others_move_with_it(
    points: dict[str, CalibrationPoint],
) -> None:
    code = points["code"]
    # Measured here: n-gram far better than its prior, EAGLE far worse than its roofline.
    rows = [row(code, "ngram-k4-n1-4", 2.4, 3.6), row(code, "eagle-k3-chain-", 0.7, 1.3)]
    calibration = fit(rows, points)
    for measured in rows:
        assert predicted_speedup(code, measured.candidate, calibration) == pytest.approx(measured.speedup)
    # An unmeasured n-gram depth on the same fingerprint rises with the measured acceptance.
    k6 = pick(code, "ngram-k6-n1-4")
    assert predicted_speedup(code, k6, calibration) > predicted_speedup(code, k6, None)


def test_the_family_scale_carries_a_measured_acceptance_to_an_unmeasured_fingerprint(
    points: dict[str, CalibrationPoint],
) -> None:
    code, rag = points["code"], points["rag"]
    # The same step cost (MAL / speedup = 1.875), acceptance far above or below the prior.
    high = fit([row(code, "ngram-k4-n1-4", 2.4, 4.5)], points)
    low = fit([row(code, "ngram-k4-n1-4", 1.05 / 1.875, 1.05)], points)
    assert high.scale(Family.NGRAM) > 1.0 > low.scale(Family.NGRAM)
    cand = pick(rag, "ngram-k4-n1-4")
    assert predicted_speedup(rag, cand, high) > 1.5 * predicted_speedup(rag, cand, low)


def two_workloads(code: CalibrationPoint, structured: CalibrationPoint) -> list[CalibrationRow]:
    """n-gram best on code, suffix best on structured."""
    return [
        row(code, "ngram-k4-n1-4", 1.5, 2.0),
        row(code, "suffix-k16-path", 1.2, 2.1),
        row(structured, "ngram-k4-n1-4", 1.1, 1.6),
        row(structured, "suffix-k16-path", 2.5, 4.0),
    ]


def test_held_out_workloads_are_predicted_without_their_own_rows(points: dict[str, CalibrationPoint]) -> None:
    code, structured = points["code"], points["structured"]
    rows = two_workloads(code, structured)
    scored = evaluate(rows, {"code": code, "structured": structured})
    # In-sample every measured speedup is predicted back: both workloads' best is found.
    assert scored["in_sample"]["top1_rate"] == 1.0
    assert scored["in_sample"]["spearman"] == pytest.approx(1.0)
    # Held out, structured is predicted from code's rows alone, not from its own.
    from_code = fit(rows[:2], {"code": code})
    held_out = {r["candidate"]: r["predicted"] for r in scored["leave_one_workload_out"]["rows"]}
    for measured in rows[2:]:
        expected = predicted_speedup(structured, measured.candidate, from_code)
        assert held_out[measured.candidate.candidate_id] == pytest.approx(expected)
        assert expected != pytest.approx(measured.speedup)


def test_each_fingerprint_gets_its_own_spearman(points: dict[str, CalibrationPoint]) -> None:
    code, structured = points["code"], points["structured"]
    scores = evaluate(two_workloads(code, structured), {"code": code, "structured": structured})
    # In-sample each fingerprint's rows are predicted back in their measured order.
    assert scores["in_sample"]["spearman_per_fingerprint"] == {
        "code": pytest.approx(1.0),
        "structured": pytest.approx(1.0),
    }
    # Each fingerprint's Spearman is over its own rows only.
    for mode in ("prior_only", "leave_one_workload_out"):
        scored = scores[mode]
        assert set(scored["spearman_per_fingerprint"]) == {"code", "structured"}
        for fingerprint, rho in scored["spearman_per_fingerprint"].items():
            mine = [r for r in scored["rows"] if r["workload"] == fingerprint]
            expected = spearman([r["predicted"] for r in mine], [r["measured"] for r in mine])
            assert rho == pytest.approx(expected)


def test_other_prompts_of_a_workload_are_scored_against_the_fit_of_the_whole_set(
    points: dict[str, CalibrationPoint],
) -> None:
    code, structured = points["code"], points["structured"]
    rows = two_workloads(code, structured)
    both = {"code": code, "structured": structured}
    assert "held_out_prompts" not in evaluate(rows, both)
    # On the other prompts code's order holds and structured's turns: n-gram wins there now.
    other = [
        *rows[:2],
        row(structured, "ngram-k4-n1-4", 2.6, 3.9),
        row(structured, "suffix-k16-path", 1.0, 1.7),
    ]
    scores = evaluate(rows, both, other)
    scored = scores["held_out_prompts"]
    predicted = {(r["workload"], r["candidate"]): r["predicted"] for r in scored["rows"]}
    whole = fit(rows, both)
    for measured in other:
        # Predicted from the first set's rows, whatever the other set measured.
        expected = predicted_speedup(both[measured.workload], measured.candidate, whole)
        assert predicted[(measured.workload, measured.candidate.candidate_id)] == pytest.approx(expected)
    assert {w: t["hit"] for w, t in scored["top1"].items()} == {"code": True, "structured": False}
    assert scored["top1_rate"] == 0.5
    # Beside it, the first set's measurements as the ranking: they disagree on structured too.
    remeasured = scores["held_out_by_measurement"]
    assert [r["predicted"] for r in remeasured["rows"]] == [r.speedup for r in rows]
    assert remeasured["top1_rate"] == 0.5


# --- the predictor loads it ---------------------------------------------------------------------


def request(gpu: str) -> RunCreateRequest:
    return RunCreateRequest.model_validate(
        {
            "target": {"model_ref": MODEL, "gpu": gpu, "engine": "speccore"},
            "workload": {"fingerprint": "structured"},
        }
    )


def test_the_predictor_ranks_by_a_loaded_calibration_of_its_target_and_profile_only(
    points: dict[str, CalibrationPoint], tmp_path: Path
) -> None:
    structured = points["structured"]
    lookahead = pick(structured, "lookahead-w5-n4-g5")
    rows = [row(structured, "lookahead-w5-n4-g5", 4.0, 4.0)]
    write_calibration(fit(rows, points), tmp_path)
    calibrations = load_calibrations(tmp_path)
    assert [(c.target_ref, c.profile) for c in calibrations] == [(structured.known.target.ref, "cpu")]

    def best(gpu: str, calibrated: bool) -> str:
        plan = plan_run(
            request(gpu),
            run_id="r1",
            host=HostInfo(cuda=False),
            calibrations=calibrations if calibrated else (),
        )
        return plan.ranked[0].candidate.candidate_id

    assert best("cpu", calibrated=False) != lookahead.candidate_id
    assert best("cpu", calibrated=True) == lookahead.candidate_id
    # A calibration of the CPU says nothing about an H100: its ranking keeps the priors.
    assert best("H100-80GB", calibrated=True) == best("H100-80GB", calibrated=False)


def test_no_calibration_directory_means_no_calibration(tmp_path: Path) -> None:
    assert load_calibrations(tmp_path / "absent") == ()
    assert Fingerprint("structured") == calibration_point(MODEL, "agentic").serving.fingerprint


def test_the_predictor_ships_the_calibration_of_its_measured_target_on_the_cpu() -> None:
    shipped = calibration_for(load_calibrations(), MODEL, "cpu")
    assert shipped is not None
    assert {str(r.candidate.family) for r in shipped.rows} >= {"ngram", "suffix", "eagle", "medusa"}
    assert calibration_for(load_calibrations(), MODEL, "H100-80GB") is None
