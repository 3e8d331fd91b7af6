"""The best-so-far curve of a tune session, drawn as a PNG (matplotlib, Agg: no display).

Glossary (schemas/tune.py): each `CurvePoint` is one ended trial, at the wall-clock minutes
since the session started; its *value* is the trial's objective (None: the trial failed),
its *best value* the best of the session up to it. The chart shows every trial's value as
a point (failed ones as crosses on the axis, seeded ones — the T1 pareto points re-measured
— hollow), the best so far as a step line, the T1 winner's value as a horizontal line,
and the budget and its 80 % auto-termination mark as vertical lines.

Pure: bytes from values. The Figure is built without pyplot, so concurrent requests in
worker threads share no global state.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from specops_schemas.tune import AUTO_TERMINATE_AT, CurvePoint

SIZE_IN = (8.0, 4.5)
DPI = 100


@dataclass(frozen=True, slots=True)
class Markers:
    """What the chart marks besides the points."""

    budget_s: float
    """The session's budget: its end, and 80 % of it, are vertical lines."""
    seeded: Collection[int] = field(default_factory=frozenset)
    """Trial numbers that re-measured the T1 run's pareto points."""
    t1_value: float | None = None
    """The T1 winner's value as re-measured in this session, a horizontal line."""
    title: str = "best so far"


def draw(points: Sequence[CurvePoint], markers: Markers) -> bytes:
    """The PNG of the curve; ValueError when there is no point to draw."""
    if not points:
        raise ValueError("the curve has no point yet")
    from matplotlib.figure import Figure  # heavy, and only the curve needs it

    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    ax = fig.add_subplot()
    ordered = sorted(points, key=lambda p: (p.elapsed_s, p.trial))
    values = [p.value for p in ordered if p.value is not None]
    floor = min([*values, *([markers.t1_value] if markers.t1_value is not None else [])], default=0.0)

    def minutes(p: CurvePoint) -> float:
        return p.elapsed_s / 60.0

    searched = [p for p in ordered if p.value is not None and p.trial not in markers.seeded]
    seeded = [p for p in ordered if p.value is not None and p.trial in markers.seeded]
    failed = [p for p in ordered if p.value is None]
    if searched:
        ax.scatter(
            [minutes(p) for p in searched],
            [p.value for p in searched],
            s=24,
            color="tab:blue",
            label="trial",
            zorder=3,
        )
    if seeded:
        ax.scatter(
            [minutes(p) for p in seeded],
            [p.value for p in seeded],
            s=36,
            facecolors="none",
            edgecolors="tab:green",
            label="seeded (T1 pareto)",
            zorder=3,
        )
    if failed:
        ax.scatter(
            [minutes(p) for p in failed],
            [floor] * len(failed),
            marker="x",
            s=30,
            color="tab:red",
            label="failed trial",
            zorder=3,
        )
    best = [p for p in ordered if p.best_value is not None]
    if best:
        xs = [minutes(p) for p in best]
        ys = [p.best_value for p in best]
        ax.step(
            [*xs, minutes(ordered[-1])],
            [*ys, ys[-1]],
            where="post",
            color="tab:orange",
            linewidth=2,
            label="best so far",
            zorder=2,
        )
    if markers.t1_value is not None:
        ax.axhline(markers.t1_value, color="tab:green", linestyle=":", label="T1 winner")
    budget_min = markers.budget_s / 60.0
    ax.axvline(budget_min, color="black", linestyle="--", linewidth=1, label="budget")
    ax.axvline(
        budget_min * AUTO_TERMINATE_AT,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"{AUTO_TERMINATE_AT:.0%} of budget",
    )
    ax.set_xlim(0.0, max(budget_min, minutes(ordered[-1])) * 1.02)
    ax.set_xlabel("elapsed (minutes)")
    ax.set_ylabel("value (priority-weighted speedup)")
    ax.set_title(markers.title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
