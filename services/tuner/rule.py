"""The auto-termination rule of a T2 session ("auto-terminate at 80 % of the budget if
the top-3 did not improve by more than 1 sigma"), made precise; pure.

Over the session's *complete* trials (measured, gate passed; failed trials have no value):

- top3(trials) = the mean value of the 3 best trials (value: `Priorities.measured_score`);
- top3_start = top3 over the *seeded* trials (the T1 pareto points and winner,
  re-measured in this session); when fewer than 3 seeded trials completed, top3 over the
  first 3 complete trials (by trial number) instead;
- top3_now = top3 over every complete trial;
- sigma = the pooled measurement noise of the current top 3: the root mean square of
  their `speedup_stdev` (the sample stdev of each trial's per-rep speedups; a value is a
  priority-weighted mean of speedups, so it is in the same unit).

The rule is checked once, at the first trial boundary (a trial ended) at or after
AUTO_TERMINATE_AT (80 %) of the budget: the session is terminated (`auto_terminated`)
iff top3_now - top3_start <= sigma. A session that improved by more than sigma runs on
to its budget, and is not checked again. With fewer than 3 complete trials there is no
top 3 to compare: the check is spent and does not fire (too little is known to call a
plateau).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specops_schemas.tune import AUTO_TERMINATE_AT

TOP = 3


@dataclass(frozen=True, slots=True)
class Done:
    """A complete trial, as the rule sees it."""

    trial: int
    value: float
    sigma: float  # speedup_stdev; 0 when unknown (one rep)
    seeded: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """The rule's check: whether it fired, and its numbers for the `tune.terminated` event."""

    fired: bool
    top3_start: float | None
    top3_now: float | None
    sigma: float
    reason: str


def top3(trials: Sequence[Done]) -> float | None:
    """The mean value of the 3 best trials; None with fewer than 3."""
    if len(trials) < TOP:
        return None
    return statistics.fmean(sorted((t.value for t in trials), reverse=True)[:TOP])


def best3(trials: Sequence[Done]) -> list[Done]:
    return sorted(trials, key=lambda t: (-t.value, t.trial))[:TOP]


def top3_start(trials: Sequence[Done]) -> float | None:
    seeded = [t for t in trials if t.seeded]
    if len(seeded) >= TOP:
        return top3(seeded)
    return top3(sorted(trials, key=lambda t: t.trial)[:TOP])


def pooled_sigma(trials: Sequence[Done]) -> float:
    """Root mean square of the trials' sigmas (0 for none)."""
    if not trials:
        return 0.0
    return math.sqrt(statistics.fmean(t.sigma**2 for t in trials))


def due(elapsed_s: float, budget_s: float, checked: bool) -> bool:
    """Whether a trial boundary at `elapsed_s` is the rule's one check."""
    return not checked and elapsed_s >= AUTO_TERMINATE_AT * budget_s


def check(trials: Sequence[Done]) -> Verdict:
    """The rule over the complete trials (call it once, when `due`)."""
    start, now = top3_start(trials), top3(trials)
    sigma = pooled_sigma(best3(trials))
    if start is None or now is None:
        return Verdict(False, start, now, sigma, f"fewer than {TOP} complete trials: no top 3 to compare")
    gain = now - start
    fired = gain <= sigma
    verb = "did not improve by more than" if fired else "improved by more than"
    reason = (
        f"at {AUTO_TERMINATE_AT:.0%} of the budget the top-3 mean {verb} 1 sigma: "
        f"{start:.4f} -> {now:.4f} (+{gain:.4f}), sigma {sigma:.4f}"
    )
    return Verdict(fired, start, now, sigma, reason)
