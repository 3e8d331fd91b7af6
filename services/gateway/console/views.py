"""What the console's pages show, decided without I/O: the navigation and the buttons a role may
use (by the API's own rules: `credentials.has_role`, `heads.transition_refusal`), and the numbers
of a run's winner, a session's trials and a head's training, formatted for a person."""

from __future__ import annotations

import json
from dataclasses import dataclass

from specops_schemas.api import API_PREFIX, RunStatusResponse
from specops_schemas.candidates import CandidateResult
from specops_schemas.catalog import Engine, Role
from specops_schemas.heads import HeadResponse
from specops_schemas.tune import TrialResult, TuneSessionResponse
from specops_services.gateway import heads, runs
from specops_services.gateway.http import credentials

UI = "/ui"
SIGN_IN = f"{UI}/sign-in"
MISSING = "—"


@dataclass(frozen=True, slots=True)
class NavItem:
    href: str
    label: str
    testid: str


def nav(role: Role) -> list[NavItem]:
    """The links of every page; a link to a page the role cannot use is left out."""
    items = [NavItem(f"{UI}/runs", "Runs", "nav-runs")]
    if can_start_runs(role):
        items.append(NavItem(f"{UI}/runs/new", "New run", "nav-new-run"))
    items += [
        NavItem(f"{UI}/tune", "Tune sessions", "nav-tune"),
        NavItem(f"{UI}/heads", "Heads", "nav-heads"),
    ]
    if credentials.has_role(role, Role.ADMIN):
        items.append(NavItem(f"{UI}/security", "Security", "nav-security"))
    return items


def can_start_runs(role: Role) -> bool:
    """POST runs and POST runs/{id}/apply need the developer role (`http.auth.Developer`)."""
    return credentials.has_role(role, Role.DEVELOPER)


def can_apply(role: Role, run: RunStatusResponse) -> bool:
    """Whether the run page offers `apply`: the role may, and the API would not refuse the run (409)."""
    winner = None if run.winner is None else run.winner.model_dump(mode="json")
    state = runs.RunState(status=run.status, winner=winner, speculation_disabled=run.speculation_disabled)
    return can_start_runs(role) and runs.apply_conflict(state) is None


# The moves a head page may offer, in lifecycle order.
MOVES = ("uat", "production", "deprecated")
# transition_refusal also refuses a move without its rationale; the page asks for one with the
# button, so the buttons are decided as if it were given.
_GIVEN = "rationale given on the page"


def head_moves(state: str, role: Role) -> list[str]:
    """The moves of a head in `state` that `role` may make: the buttons its page shows."""
    return [to for to in MOVES if heads.transition_refusal(state, to, role, _GIVEN) is None]


def needs_rationale(moves: list[str]) -> bool:
    return any(to in heads.RATIONALE_REQUIRED for to in moves)


# --- numbers ----------------------------------------------------------------------------------


def speedup(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}×"


def percent(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:.1f} %"


def mean_sigma(mean: float | None, sigma: float | None) -> str:
    """A trial's speedup as `mean ± σ`."""
    if mean is None:
        return MISSING
    return f"{mean:.2f} ± {sigma:.2f}×" if sigma is not None else speedup(mean)


@dataclass(frozen=True, slots=True)
class Hero:
    """The winner hero of a run page (SpecWinnerHero)."""

    family: str
    draft: str
    shape: str
    measured_speedup: str
    predicted_speedup: str
    acceptance: str
    mean_accept_len: str
    gate: str


def shape(result: CandidateResult) -> str:
    candidate = result.candidate
    if candidate.tree:
        return f"k={candidate.k}, tree {candidate.tree}"
    return f"k={candidate.k}"


def gate_verdict(result: CandidateResult) -> str:
    gate = result.gate
    if gate is None:
        return "not gated"
    verdict = {True: "passed", False: "failed", None: "pending"}[gate.passed]
    if gate.score is None or gate.threshold is None:
        return f"{gate.method.value}: {verdict}"
    return f"{gate.method.value}: {verdict} ({gate.score:.3f} vs {gate.threshold:.3f})"


def hero(result: CandidateResult) -> Hero:
    """Measured numbers where the winner was measured, the prediction's otherwise."""
    measured, predicted = result.measurement, result.prediction
    return Hero(
        family=result.candidate.family.value,
        draft=result.candidate.draft or MISSING,
        shape=shape(result),
        measured_speedup=speedup(None if measured is None else measured.speedup),
        predicted_speedup=speedup(predicted.speedup),
        acceptance=percent(predicted.acceptance_rate if measured is None else measured.acceptance_rate),
        mean_accept_len=f"{(predicted if measured is None else measured).mean_acceptance_length:.2f}",
        gate=gate_verdict(result),
    )


def engines() -> list[str]:
    return [engine.value for engine in Engine]


# --- tune sessions ----------------------------------------------------------------------------


def trial_speedup(trial: TrialResult) -> str:
    return mean_sigma(trial.speedup, trial.speedup_stdev)


def curve_json(session: TuneSessionResponse) -> str:
    """The session's ended trials for the best-so-far chart (the page's script draws it)."""
    return json.dumps([point.model_dump(mode="json") for point in session.curve])


# --- heads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    epoch: int
    epochs: int
    text: str


def train_progress(head: HeadResponse) -> Progress:
    """Epochs done of those asked for, and the last epoch's loss; full once training has ended."""
    done = [epoch for epoch in head.epochs if epoch.epoch > 0]
    last = done[-1] if done else None
    loss = MISSING if last is None or last.train_loss is None else f"{last.train_loss:.3f}"
    epoch = 0 if last is None else last.epoch
    if head.state != "training":
        return Progress(epoch, max(epoch, 1), f"training ended after {epoch} epochs, loss {loss}")
    total = head.request.epochs
    return Progress(epoch, total, f"epoch {epoch} of {total}, loss {loss}")


def sse_url(kind: str, resource_id: str) -> str:
    return f"{API_PREFIX}/{kind}/{resource_id}/events"


@dataclass(frozen=True, slots=True)
class EventLine:
    seq: int
    type: str
    at: str


def event_line(seq: int, type: str, data: str) -> EventLine:
    """One line of a page's event log: the event's number, type and time (UTC, to the second)."""
    occurred = json.loads(data).get("occurred_at") or ""
    return EventLine(seq, type, occurred[11:19])
