"""The gateway's T2 decisions without servers: the session fold, the cached answer, apply, the curve PNG,
and the lines `specops tune` prints."""

from __future__ import annotations

import io
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specbus.envelope import Envelope, new_event
from specops.client import RunEvent
from specops.commands.tune import Progress, candidate_text, clock
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Measurement, Prediction
from specops_schemas.catalog import Family, GateMethod, RunStatus
from specops_schemas.security import OPT_OUT_REASON
from specops_schemas.tune import (
    CurvePoint,
    Dimension,
    TrialResult,
    TuneCompleted,
    TuneFailed,
    TuneRequested,
    TuneSessionCreateRequest,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneTerminated,
    TuneTrialCompleted,
)
from specops_services.gateway.tune import curve
from specops_services.gateway.tune import logic as tune_logic

SESSION = "5b0a3a53-7c1e-4f7e-9a52-1d6f6a0c9e01"
RUN = "0d9e1a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b"
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
GATE = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95)
PREDICTION = Prediction(
    rank=1, score=1.0, acceptance_rate=0.5, mean_acceptance_length=1.9, speedup=1.5, extra_memory_bytes=0
)
NGRAM4 = Candidate(
    candidate_id="ngram-k4", family=Family.NGRAM, k=4, options={"ngram_min": 1, "ngram_max": 4}
)
TUNED4 = NGRAM4.model_copy(update={"candidate_id": "t2-trial-0"})
NGRAM6 = Candidate(candidate_id="ngram-k6", family=Family.NGRAM, k=6)
LOOKAHEAD = Candidate(candidate_id="lookahead-k5", family=Family.LOOKAHEAD, k=5, options={"window": 4})
RUN_REQUEST = RunCreateRequest.model_validate(
    {
        "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
        "workload": {"fingerprint": "code"},
    }
)


def measured(candidate: Candidate, speedup: float) -> CandidateResult:
    m = Measurement(
        candidate_id=candidate.candidate_id,
        reps=2,
        tokens_per_s=20.0 * speedup,
        tokens_per_s_stdev=0.3,
        speedup=speedup,
        acceptance_rate=0.5,
        mean_acceptance_length=1.9,
        per_position_acceptance=[0.5] * candidate.k,
        ttft_s=0.1,
        tpot_s=0.05,
        extra_memory_bytes=0,
    )
    return CandidateResult(candidate=candidate, prediction=PREDICTION, measurement=m, gate=GATE)


def trial(n: int, candidate: Candidate, value: float | None, *, seeded: bool = False) -> TrialResult:
    common: dict[str, Any] = {
        "trial": n,
        "bench_id": f"bench-{n}",
        "candidate": candidate,
        "params": {},
        "seeded": seeded,
        "started_at": T0 + timedelta(minutes=n),
    }
    if value is None:
        return TrialResult(**common, state="failed", error_stage="quality_gate", error_message="gate failed")
    return TrialResult(**common, state="complete", value=value, speedup=value, speedup_stdev=0.05)


def envelope(payload: Any) -> Envelope[Any]:
    return new_event(payload, tenant_id="acme", correlation_id=SESSION, producer="tuner")


def requested() -> Envelope[TuneRequested]:
    return new_event(
        TuneRequested(
            session_id=SESSION,
            request=TuneSessionCreateRequest(run_id=RUN, budget_minutes=20),
            run_request=RUN_REQUEST,
            run_candidates=[
                measured(NGRAM4, 1.3),
                CandidateResult(candidate=LOOKAHEAD, prediction=PREDICTION),
            ],
            run_pareto_front=["ngram-k4", "lookahead-k5"],
            run_winner=measured(NGRAM4, 1.3),
            requested_by="tok-1",
        ),
        tenant_id="acme",
        correlation_id=SESSION,
        producer="gateway",
    )


def ended(result: TrialResult, elapsed_s: float, best: float | None) -> Envelope[Any]:
    point = CurvePoint(trial=result.trial, elapsed_s=elapsed_s, value=result.value, best_value=best)
    return envelope(TuneTrialCompleted(session_id=SESSION, result=result, point=point))


def started() -> Envelope[Any]:
    return envelope(
        TuneStarted(
            session_id=SESSION,
            space=[Dimension(name="k", choices=[2, 4, 6])],
            seeded=1,
            budget_s=1200.0,
            started_at=T0,
            deadline=T0 + timedelta(seconds=1200),
        )
    )


def completed(winner: CandidateResult | None) -> Envelope[Any]:
    return envelope(
        TuneCompleted(
            session_id=SESSION,
            run_id=RUN,
            run_request=RUN_REQUEST,
            winner=winner,
            baseline=None,
            best=None,
            trials=3,
            failed_trials=1,
            curve=[],
            auto_terminated=True,
            reason="auto-terminated",
            elapsed_s=960.0,
            downtime_s=30.0,
        )
    )


# --- the fold ---------------------------------------------------------------------------------------


def test_a_session_folds_trials_best_narrowing_and_its_end() -> None:
    session = tune_logic.open_session(requested())
    assert session.status == "queued" and session.budget_s == 1200.0
    session = tune_logic.fold(session, started())
    assert session.status == "running" and session.deadline == T0 + timedelta(seconds=1200)
    # Trials may arrive out of order; a redelivered one replaces itself.
    for event in (ended(trial(2, NGRAM6, 1.6), 180, 1.6), ended(trial(0, TUNED4, 1.4, seeded=True), 60, 1.4)):
        session = tune_logic.fold(session, event)
    again = ended(trial(1, LOOKAHEAD, None), 120, 1.4)
    session = tune_logic.fold(tune_logic.fold(session, again), again)
    assert [t.trial for t in session.trials] == [0, 1, 2]
    assert [c.trial for c in session.curve] == [0, 1, 2]
    assert session.best is not None and session.best.trial == 2
    narrowed = TuneSpaceNarrowed(
        session_id=SESSION, importances={"k": 1.0}, dropped={"family": "ngram"}, after_trials=2
    )
    session = tune_logic.fold(session, envelope(narrowed))
    assert session.dropped == {"family": "ngram"} and session.importances == {"k": 1.0}
    terminated = TuneTerminated(
        session_id=SESSION, reason="top-3 flat", elapsed_s=960.0, top3_start=1.4, top3_now=1.45, sigma=0.05
    )
    session = tune_logic.fold(session, envelope(terminated))
    assert session.auto_terminated and session.termination_reason == "top-3 flat"
    done = tune_logic.fold(session, completed(measured(NGRAM6, 1.6)))
    assert (
        done.status == "completed"
        and done.downtime_s == 30.0
        and done.termination_reason == "auto-terminated"
    )
    assert done.curve == session.curve  # the event's empty curve does not erase the projected one
    # A finished session keeps its answer: a late event moves nothing.
    late = envelope(TuneFailed(session_id=SESSION, error_stage="benchmark", message="late"))
    assert tune_logic.fold(done, late) is done
    assert tune_logic.fold(done, started()) is done


def test_a_failed_session_carries_its_error() -> None:
    session = tune_logic.open_session(requested())
    failed = tune_logic.fold(
        session, envelope(TuneFailed(session_id=SESSION, error_stage="benchmark", message="x"))
    )
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "x"


def test_a_session_ended_by_the_opt_out_says_so() -> None:
    session = tune_logic.open_session(requested())
    payload = completed(None).payload.model_copy(update={"speculation_disabled": OPT_OUT_REASON})
    done = tune_logic.fold(session, envelope(payload))
    assert done.status == "completed" and done.winner is None and done.speculation_disabled == OPT_OUT_REASON
    assert tune_logic.fold(session, completed(None)).speculation_disabled is None


# --- POST checks, the cached answer, apply -------------------------------------------------------------


def test_only_a_completed_measured_run_can_be_tuned() -> None:
    assert tune_logic.create_conflict(RUN, RunStatus.COMPLETED, True) is None
    assert tune_logic.create_conflict(RUN, RunStatus.RUNNING, None) == (
        f"run {RUN} is running; a tune session needs a completed run"
    )
    assert "cannot be measured on this host" in (
        tune_logic.create_conflict(RUN, RunStatus.COMPLETED, False) or ""
    )


def test_the_tuned_winner_heads_the_cached_answer() -> None:
    source = tune_logic.Source.of(requested().payload)
    winner = measured(NGRAM4.model_copy(update={"k": 5}), 1.7)  # same id as the T1 winner, retuned
    answer = tune_logic.cache_answer(source, completed(winner).payload)
    assert answer is not None and answer.measured and answer.winner == winner
    assert [c.candidate.candidate_id for c in answer.candidates] == ["ngram-k4", "lookahead-k5"]
    assert answer.candidates[0].candidate.k == 5
    assert answer.pareto_front == ["ngram-k4", "lookahead-k5"]
    assert tune_logic.cache_answer(source, completed(None).payload) is None
    assert tune_logic.Source.from_json(source.to_json()) == source


def test_a_session_that_left_out_the_t1_winners_family_keeps_t1s_answer() -> None:
    source = tune_logic.Source.of(requested().payload)
    assert source.winner is not None and source.winner.candidate.family == "ngram"
    winner = measured(NGRAM4.model_copy(update={"candidate_id": "t3-lookahead", "family": "lookahead"}), 1.9)
    assert tune_logic.cache_answer(source, completed(winner).payload, ["lookahead"]) is None
    searched = tune_logic.cache_answer(source, completed(winner).payload, ["lookahead", "ngram"])
    assert searched is not None and searched.winner == winner


def test_apply_picks_the_winner_or_a_complete_trial() -> None:
    session = tune_logic.open_session(requested())
    assert "queued" in (tune_logic.apply_conflict(session) or "")
    for event in (ended(trial(0, TUNED4, 1.4), 60, 1.4), ended(trial(1, LOOKAHEAD, None), 120, 1.4)):
        session = tune_logic.fold(session, event)
    session = tune_logic.fold(session, completed(measured(TUNED4, 1.4)))
    assert tune_logic.apply_conflict(session) is None
    assert tune_logic.pick_candidate(session, None) == TUNED4
    assert tune_logic.pick_candidate(session, "t2-trial-0") == TUNED4
    with pytest.raises(LookupError, match="not measured and gated"):
        tune_logic.pick_candidate(session, "lookahead-k5")
    with pytest.raises(LookupError, match="not among"):
        tune_logic.pick_candidate(session, "eagle-k3")


def test_the_t1_winner_is_found_among_the_seeded_trials_by_its_configuration() -> None:
    session = tune_logic.open_session(requested())
    session = tune_logic.fold(session, ended(trial(0, TUNED4, 1.35, seeded=True), 60, 1.35))
    found = tune_logic.t1_winner_trial(session, measured(NGRAM4, 1.3))
    assert found is not None and found.value == 1.35
    assert tune_logic.t1_winner_trial(session, measured(NGRAM6, 1.3)) is None


# --- the curve ---------------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_curve_is_a_png_of_the_points_and_markers() -> None:
    points = [
        CurvePoint(trial=0, elapsed_s=60, value=1.2, best_value=1.2),
        CurvePoint(trial=1, elapsed_s=130, value=None, best_value=1.2),
        CurvePoint(trial=2, elapsed_s=200, value=1.5, best_value=1.5),
    ]
    png = curve.draw(points, curve.Markers(budget_s=600, seeded={0}, t1_value=1.2))
    assert png_size(png) == (800, 450)
    # Every point failed, past the budget: still a chart (the axis stretches to the last point).
    failed = [CurvePoint(trial=0, elapsed_s=700, value=None, best_value=None)]
    assert png_size(curve.draw(failed, curve.Markers(budget_s=600))) == (800, 450)
    with pytest.raises(ValueError, match="no point"):
        curve.draw([], curve.Markers(budget_s=600))
    assert io.BytesIO(png).getbuffer().nbytes > 10_000  # drawn, not an empty canvas


# --- `specops tune` lines ----------------------------------------------------------------------------


def sse(seq: int, event: Envelope[Any]) -> RunEvent:
    return RunEvent(id=str(seq), type=event.type, data={}, envelope=event)


def test_tune_prints_one_line_per_trial() -> None:
    assert clock(750) == "12:30" and clock(4000) == "66:40"
    assert candidate_text(NGRAM4) == "ngram k=4 ngram 1-4"
    assert candidate_text(LOOKAHEAD) == "lookahead k=5 window=4"
    progress = Progress()
    assert progress.describe(sse(1, requested())) == f"queued: tuning run {RUN} for 20:00"
    progress.describe(sse(2, started()))
    first = progress.describe(sse(3, ended(trial(0, NGRAM4, 1.51), 60, 1.51)))
    assert first == "trial 0  ngram k=4 ngram 1-4  1.51x ± 0.05  best 1.51x (trial 0)  [1:00 of 20:00]"
    third = progress.describe(sse(4, ended(trial(3, NGRAM6, 1.42), 750, 1.51)))
    assert third == "trial 3  ngram k=6  1.42x ± 0.05  best 1.51x (trial 0)  [12:30 of 20:00]"
    failed = progress.describe(sse(5, ended(trial(4, LOOKAHEAD, None), 800, 1.51)))
    assert failed is not None and "FAILED (quality_gate: gate failed)" in failed
