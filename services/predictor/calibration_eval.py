"""How well the predictor ranks a calibration set: Spearman and the top-1 rule, fitted four ways.

- Spearman: the rank correlation between predicted and measured speedups over every row
  of the set (ties take their average rank; Spearman 1904).
- top-1: per workload, the candidate the predictor ranks first is a hit when its measured
  speedup is within TOP1_TOLERANCE of the best measured on that workload.
- The bar (issue 22): Spearman >= 0.8 and top-1 hits in >= 80 % of workloads.

Fits, from the one that cannot flatter to the one that can:

- ``prior_only``: the predictor without a calibration (its priors and roofline);
- ``leave_one_fingerprint_out``: each workload predicted from a calibration fitted on the
  workloads of other fingerprints only (agentic and structured share one);
- ``leave_one_workload_out``: fitted on every other workload;
- ``held_out_prompts`` (when a second set is measured: bench/calibrate.py --prompt-offset):
  other prompts of the same workloads, predicted from the calibration fitted on every
  workload — what a user's own traffic of a calibrated kind meets; it flatters no more
  than the two sets' prompts resemble each other; beside it ``held_out_by_measurement``,
  the same rows ranked by the first set's own measured speedups: how far one measurement
  agrees with another on other prompts, the ceiling a fit of the first set can reach;
- ``in_sample``: fitted on every workload, the held-out one included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specops_services.predictor.calibration import Calibration, CalibrationRow
from specops_services.predictor.calibration_set import CalibrationPoint, fit, predicted_speedup

TOP1_TOLERANCE = 0.05
SPEARMAN_BAR = 0.8
TOP1_BAR = 0.8


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            out[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's over the ranks (0 when either side is constant)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need two equally long sequences of 2+ values, got {len(xs)} and {len(ys)}")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else 0.0


def top1(predicted: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, Any]:
    """The predicted best, the measured best, and whether the first is within tolerance of the second."""
    pick = max(predicted, key=lambda c: predicted[c])
    best = max(measured, key=lambda c: measured[c])
    return {
        "predicted_best": pick,
        "measured_best": best,
        "measured_of_predicted_best": measured[pick],
        "best_measured": measured[best],
        "hit": measured[pick] >= (1.0 - TOP1_TOLERANCE) * measured[best],
    }


def score(predictions: Sequence[tuple[CalibrationRow, float]]) -> dict[str, Any]:
    """Spearman over every (row, predicted speedup) pair and over each fingerprint's rows, and
    the top-1 rule per workload."""
    per_workload: dict[str, dict[str, tuple[float, float]]] = {}
    per_fingerprint: dict[str, list[tuple[float, float]]] = {}
    for row, predicted in predictions:
        per_workload.setdefault(row.workload, {})[row.candidate.candidate_id] = (predicted, row.speedup)
        per_fingerprint.setdefault(row.fingerprint, []).append((predicted, row.speedup))
    top = {
        w: top1({c: p for c, (p, _) in rows.items()}, {c: m for c, (_, m) in rows.items()})
        for w, rows in per_workload.items()
    }
    rho = spearman([p for _, p in predictions], [r.speedup for r, _ in predictions])
    rate = sum(t["hit"] for t in top.values()) / len(top)
    return {
        "spearman": rho,
        "top1_rate": rate,
        "meets_bar": rho >= SPEARMAN_BAR and rate >= TOP1_BAR,
        "spearman_per_fingerprint": {
            f: spearman([p for p, _ in pairs], [m for _, m in pairs])
            for f, pairs in per_fingerprint.items()
            if len(pairs) >= 2
        },
        "top1": top,
        "rows": [
            {
                "workload": r.workload,
                "candidate": r.candidate.candidate_id,
                "predicted": p,
                "measured": r.speedup,
            }
            for r, p in predictions
        ],
    }


def _held_out(
    rows: Sequence[CalibrationRow],
    points: Mapping[str, CalibrationPoint],
    same: Callable[[CalibrationRow, str], bool],
) -> list[tuple[CalibrationRow, float]]:
    """Each workload's rows predicted from a calibration fitted on the rows `same` keeps out."""
    out = []
    for workload, point in points.items():
        train = [r for r in rows if not same(r, workload)]
        calibration = fit(train, points) if train else None
        out += [
            (r, predicted_speedup(point, r.candidate, calibration)) for r in rows if r.workload == workload
        ]
    return out


def evaluate(
    rows: Sequence[CalibrationRow],
    points: Mapping[str, CalibrationPoint],
    held_out: Sequence[CalibrationRow] = (),
) -> dict[str, Any]:
    """Every fit of the module docstring, scored; `points`: the point of every workload in
    `rows` and `held_out` (rows of the same workloads' other prompts, scored when given)."""

    def fitted(
        calibration: Calibration | None, scored: Sequence[CalibrationRow] = rows
    ) -> list[tuple[CalibrationRow, float]]:
        return [(r, predicted_speedup(points[r.workload], r.candidate, calibration)) for r in scored]

    def same_fingerprint(row: CalibrationRow, workload: str) -> bool:
        return row.fingerprint == points[workload].serving.fingerprint

    calibration = fit(rows, points)
    scores = {
        "bar": {"spearman": SPEARMAN_BAR, "top1_rate": TOP1_BAR, "top1_tolerance": TOP1_TOLERANCE},
        "prior_only": score(fitted(None)),
        "leave_one_fingerprint_out": score(_held_out(rows, points, same_fingerprint)),
        "leave_one_workload_out": score(_held_out(rows, points, lambda r, w: r.workload == w)),
        "in_sample": score(fitted(calibration)),
    }
    if held_out:
        scores["held_out_prompts"] = score(fitted(calibration, held_out))
        first = {(r.workload, r.candidate.candidate_id): r.speedup for r in rows}
        scores["held_out_by_measurement"] = score(
            [(r, first[key]) for r in held_out if (key := (r.workload, r.candidate.candidate_id)) in first]
        )
    return scores
