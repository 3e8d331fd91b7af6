"""The console's pure decisions: the buttons a role sees, the winner hero's numbers, the CSRF rule
and the list pages' cursor (the fingerprint wizard and inference: tests/unit/test_fingerprint.py)."""

from __future__ import annotations

import pytest

from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Measurement, Prediction
from specops_schemas.catalog import Family, GateMethod, Role
from specops_services.gateway.console import views
from specops_services.gateway.http import credentials, params

# --- what each role sees ------------------------------------------------------------------------------


def test_navigation_per_role() -> None:
    def ids(role: Role) -> list[str]:
        return [item.testid for item in views.nav(role)]

    assert ids(Role.VIEWER) == ["nav-runs", "nav-tune", "nav-heads"]
    assert (
        ids(Role.DEVELOPER) == ids(Role.HEAD_REVIEWER) == ["nav-runs", "nav-new-run", "nav-tune", "nav-heads"]
    )
    assert ids(Role.ADMIN) == ["nav-runs", "nav-new-run", "nav-tune", "nav-heads", "nav-security"]


@pytest.mark.parametrize(
    ("state", "role", "moves"),
    [
        ("training", Role.ADMIN, []),
        ("validated", Role.VIEWER, []),
        ("validated", Role.DEVELOPER, ["uat", "deprecated"]),
        ("uat", Role.DEVELOPER, ["deprecated"]),
        ("uat", Role.HEAD_REVIEWER, ["production", "deprecated"]),
        ("uat", Role.ADMIN, ["production", "deprecated"]),
        ("production", Role.ADMIN, ["deprecated"]),
        ("deprecated", Role.ADMIN, []),
    ],
)
def test_head_buttons_are_the_moves_the_api_allows(state: str, role: Role, moves: list[str]) -> None:
    assert views.head_moves(state, role) == moves
    assert views.needs_rationale(moves) == bool({"production", "deprecated"} & set(moves))


# --- numbers ----------------------------------------------------------------------------------------

PREDICTION = Prediction(
    rank=1, score=1.0, acceptance_rate=0.6, mean_acceptance_length=2.5, speedup=2.1, extra_memory_bytes=0
)
CANDIDATE = Candidate(candidate_id="eagle-k4", family=Family.EAGLE, draft="yuhuili/EAGLE", k=4, tree=[2, 2])


def test_the_hero_shows_measured_numbers_and_the_prediction_beside_them() -> None:
    measured = Measurement(
        candidate_id="eagle-k4",
        reps=3,
        tokens_per_s=80.0,
        tokens_per_s_stdev=1.0,
        speedup=1.87,
        acceptance_rate=0.55,
        mean_acceptance_length=2.3,
        per_position_acceptance=[0.7],
        ttft_s=0.1,
        tpot_s=0.02,
        extra_memory_bytes=0,
    )
    gate = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.991, threshold=0.95)
    hero = views.hero(
        CandidateResult(candidate=CANDIDATE, prediction=PREDICTION, measurement=measured, gate=gate)
    )
    assert (hero.family, hero.draft, hero.shape) == ("eagle", "yuhuili/EAGLE", "k=4, tree [2, 2]")
    assert (hero.measured_speedup, hero.predicted_speedup) == ("1.87×", "2.10×")
    assert (hero.acceptance, hero.mean_accept_len) == ("55.0 %", "2.30")
    assert hero.gate == "topk5: passed (0.991 vs 0.950)"
    predicted = views.hero(CandidateResult(candidate=CANDIDATE, prediction=PREDICTION))
    assert (predicted.measured_speedup, predicted.acceptance, predicted.gate) == ("—", "60.0 %", "not gated")


def test_mean_and_sigma() -> None:
    assert views.mean_sigma(1.6, 0.04) == "1.60 ± 0.04×"
    assert views.mean_sigma(1.6, None) == "1.60×"
    assert views.mean_sigma(None, None) == "—"


# --- the cookie's CSRF rule and the pages' cursor ---------------------------------------------------


def test_csrf_is_asked_of_unsafe_methods_only() -> None:
    assert credentials.csrf_refusal("GET", None, None) is None
    assert credentials.csrf_refusal("post", "abc", "abc") is None
    for cookie, header in ((None, "abc"), ("abc", None), ("abc", "abd"), ("", "")):
        assert credentials.csrf_refusal("DELETE", cookie, header) is not None


def test_next_before_is_the_last_row_when_there_is_more() -> None:
    assert params.next_before([1, 2, 3], 3, str) == ([1, 2, 3], None)
    assert params.next_before([1, 2, 3, 4], 3, str) == ([1, 2, 3], "3")
