"""A host's calibration: what one measured calibration set teaches the predictor about a target.

Glossary (see model.py for ``a`` and ``E[N]``):

- calibration row: one catalog candidate measured on one workload of the calibration set
  (bench/calibrate.py): its speedup over ``none`` in the same interleaved run, its mean
  acceptance length (MAL) and per-token acceptance.
- step cost ``c``: the time of one speculative step in plain decode steps, as the wall
  clock saw it: ``c = MAL / speedup`` (speedup = E[N] / c, model.speedup). It holds the
  drafting, the verify block and the bookkeeping of this family and shape on this host,
  which the roofline cost model only estimates.
- family scale: how far this target's measured per-token acceptance sits from the family's
  prior (the geometric mean of measured / prior ``a`` over the calibration's rows, shrunk
  towards 1 by PRIOR_STRENGTH rows); it carries the calibration to fingerprints not measured.

What the predictor does with it (model.predict), for the calibration's target and hardware
profile only — other targets, GPUs and engines keep their priors and their sources:

1. the prior ``a`` is multiplied by the family scale;
2. the rows are history rows (model.HistoryRow) of their family x fingerprint, so an
   unmeasured shape of a measured family gets the measured per-token acceptance;
3. a measured shape (family, draft, k, tree, options) on a measured fingerprint gets its
   measured MAL and step cost ``c``; on another fingerprint, the geometric mean of its step
   costs (``c`` moves with the workload: copy-based families draft more per step where
   more repeats, and a verify block's cost grows with its size).

The file lives in CALIBRATION_DIR as ``<target>-<profile>.json``; :func:`load_calibrations`
reads every file there when the predictor starts.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Fingerprint

CALIBRATION_DIR = Path(__file__).parent / "calibrations"
PRIOR_STRENGTH = 2.0
# A per-token acceptance of 0 (nothing ever accepted) has no log; this floor stands in.
MIN_ACCEPTANCE = 0.01


def shape_key(candidate: Candidate) -> str:
    """What makes two candidates the same configuration: family, draft, k, tree and options."""
    return json.dumps(
        [
            str(candidate.family),
            candidate.draft,
            candidate.k,
            candidate.tree,
            sorted(candidate.options.items()),
        ]
    )


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One measured candidate of the calibration set (a row of bench/calibrate.py's JSON)."""

    workload: str
    fingerprint: Fingerprint
    candidate: Candidate
    speedup: float  # tokens/s over none's in the same run
    mean_acceptance_length: float  # tokens per verify step, bonus included
    acceptance: float  # accepted / drafted

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> CalibrationRow:
        return cls(
            workload=str(row["workload"]),
            fingerprint=Fingerprint(row["fingerprint"]),
            candidate=Candidate.model_validate(row["candidate"]),
            speedup=float(row["speedup"]),
            mean_acceptance_length=float(row["mean_acceptance_length"]),
            acceptance=float(row["acceptance"]),
        )

    @property
    def step_cost(self) -> float:
        """c = MAL / speedup: one speculative step's time in plain decode steps."""
        return self.mean_acceptance_length / self.speedup


@dataclass(frozen=True, slots=True)
class ShapeFit:
    """A measured shape: its step cost and MAL per fingerprint, and its step cost over all."""

    candidate: Candidate
    step_cost: float  # geometric mean over every row
    mean_acceptance_length: dict[str, float]  # by fingerprint
    rows: int
    step_cost_by_fingerprint: dict[str, float] = field(default_factory=dict)

    def cost(self, fingerprint: str) -> float:
        return self.step_cost_by_fingerprint.get(fingerprint, self.step_cost)


@dataclass(frozen=True, slots=True)
class Calibration:
    target_ref: str
    profile: str  # the hardware profile measured (speccatalog.hardware), e.g. cpu
    family_scale: dict[str, float]
    shapes: dict[str, ShapeFit]  # by shape_key
    rows: tuple[CalibrationRow, ...] = field(default=())
    source: str = ""  # the calibration set it was fitted on

    def applies(self, target_ref: str, profile: str) -> bool:
        return (self.target_ref.lower(), self.profile) == (target_ref.lower(), profile)

    def shape(self, candidate: Candidate) -> ShapeFit | None:
        return self.shapes.get(shape_key(candidate))

    def scale(self, family: str) -> float:
        return self.family_scale.get(family, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "target_ref": self.target_ref,
            "profile": self.profile,
            "source": self.source,
            "family_scale": self.family_scale,
            "shapes": [
                {
                    "candidate": s.candidate.model_dump(mode="json"),
                    "step_cost": s.step_cost,
                    "mean_acceptance_length": s.mean_acceptance_length,
                    "step_cost_by_fingerprint": s.step_cost_by_fingerprint,
                    "rows": s.rows,
                }
                for s in self.shapes.values()
            ],
            "rows": [
                {
                    "workload": r.workload,
                    "fingerprint": str(r.fingerprint),
                    "candidate": r.candidate.model_dump(mode="json"),
                    "speedup": r.speedup,
                    "mean_acceptance_length": r.mean_acceptance_length,
                    "acceptance": r.acceptance,
                }
                for r in self.rows
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        shapes = {}
        for s in data["shapes"]:
            cand = Candidate.model_validate(s["candidate"])
            shapes[shape_key(cand)] = ShapeFit(
                candidate=cand,
                step_cost=float(s["step_cost"]),
                mean_acceptance_length={str(k): float(v) for k, v in s["mean_acceptance_length"].items()},
                rows=int(s["rows"]),
                step_cost_by_fingerprint={str(k): float(v) for k, v in s["step_cost_by_fingerprint"].items()},
            )
        return cls(
            target_ref=str(data["target_ref"]),
            profile=str(data["profile"]),
            family_scale={str(k): float(v) for k, v in data["family_scale"].items()},
            shapes=shapes,
            rows=tuple(CalibrationRow.from_json(r) for r in data["rows"]),
            source=str(data.get("source", "")),
        )


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fit_shapes(rows: Iterable[CalibrationRow]) -> dict[str, ShapeFit]:
    """Per measured shape: the geometric mean of its step costs, the mean MAL per fingerprint."""
    by_shape: dict[str, list[CalibrationRow]] = defaultdict(list)
    for row in rows:
        if row.speedup > 0 and row.mean_acceptance_length >= 1.0:
            by_shape[shape_key(row.candidate)].append(row)
    fits = {}
    for key, group in by_shape.items():
        mal: dict[str, list[float]] = defaultdict(list)
        cost: dict[str, list[float]] = defaultdict(list)
        for row in group:
            mal[str(row.fingerprint)].append(row.mean_acceptance_length)
            cost[str(row.fingerprint)].append(row.step_cost)
        fits[key] = ShapeFit(
            candidate=group[0].candidate,
            step_cost=_geomean([r.step_cost for r in group]),
            mean_acceptance_length={fp: sum(v) / len(v) for fp, v in mal.items()},
            rows=len(group),
            step_cost_by_fingerprint={fp: _geomean(v) for fp, v in cost.items()},
        )
    return fits


def fit_family_scale(observed: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """Per family, exp(sum log(a_measured / a_prior) / (n + PRIOR_STRENGTH)) over
    (family, measured a, prior a) triples: the prior's correction, shrunk towards 1."""
    logs: dict[str, list[float]] = defaultdict(list)
    for family, measured, prior in observed:
        if prior > 0:
            logs[family].append(math.log(max(measured, MIN_ACCEPTANCE) / max(prior, MIN_ACCEPTANCE)))
    return {family: math.exp(sum(v) / (len(v) + PRIOR_STRENGTH)) for family, v in logs.items()}


def calibration_path(directory: Path, target_ref: str, profile: str) -> Path:
    return directory / f"{target_ref.replace('/', '_')}-{profile}.json"


def write_calibration(calibration: Calibration, directory: Path = CALIBRATION_DIR) -> Path:
    path = calibration_path(directory, calibration.target_ref, calibration.profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration.to_json(), indent=2) + "\n")
    return path


def load_calibrations(directory: Path = CALIBRATION_DIR) -> tuple[Calibration, ...]:
    """Every calibration file in `directory` (none if it does not exist)."""
    if not directory.is_dir():
        return ()
    return tuple(Calibration.from_json(json.loads(p.read_text())) for p in sorted(directory.glob("*.json")))


def calibration_for(calibrations: Iterable[Calibration], target_ref: str, profile: str) -> Calibration | None:
    return next((c for c in calibrations if c.applies(target_ref, profile)), None)
