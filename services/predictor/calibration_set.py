"""The calibration set's serving points: what the predictor ranks for one workload measured here.

A calibration run (bench/calibrate.py) measures the catalog's own candidates for a local
target on the CPU profile with speccore, greedily, at batch 1 — the candidates, heads and
datastores T1 would rank for that target (plan.plan_run), so a measured row and a
prediction describe the same configuration. :func:`fit` turns measured rows into the
predictor's calibration. Pure: the catalog and the families' specs only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from speccatalog.families.base import Known
from speccatalog.hardware import Deployment, deploy, resolve_profile
from speccatalog.targets import TargetInfo, resolve_target
from speccatalog.workloads import workload_spec
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Fingerprint
from specops_services.predictor.calibration import Calibration, CalibrationRow, fit_family_scale, fit_shapes
from specops_services.predictor.catalog import build_catalog, known_for
from specops_services.predictor.model import Workload, invert_mean_length, predict, prior_acceptance
from specops_services.predictor.plan import builtin_datastore_refs, builtin_head_refs

CPU = "cpu"
GREEDY = 0.0


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """One workload of the calibration set, as the predictor sees it."""

    workload: str  # the prompt set (agentic measures the structured fingerprint)
    deployment: Deployment
    serving: Workload
    known: Known
    candidates: list[Candidate]  # the catalog's, after pruning, in catalog order


def calibration_point(target_ref: str, workload: str) -> CalibrationPoint:
    """The greedy batch-1 CPU serving point of `workload` for `target_ref` and its catalog."""
    target: TargetInfo = resolve_target(target_ref)
    spec = workload_spec(workload)
    fingerprint = Fingerprint(spec.fingerprint)
    dep = deploy(target, resolve_profile(CPU), context_tokens=min(spec.context, target.context), batch=1)
    known = known_for(
        target, heads=builtin_head_refs(target), datastores=builtin_datastore_refs(target, fingerprint)
    )
    catalog = build_catalog(dep, fingerprint, Engine.SPECCORE, known)
    serving = Workload(fingerprint=fingerprint, temperature=GREEDY, latency_batch=1, throughput_batch=1)
    return CalibrationPoint(workload, dep, serving, known, catalog.kept)


def select(candidates: Sequence[Candidate], grid: Sequence[str]) -> list[Candidate]:
    """The candidates whose id starts with one of `grid`'s prefixes (a family's key options)."""
    return [c for c in candidates if any(c.candidate_id.startswith(prefix) for prefix in grid)]


def fit(
    rows: Sequence[CalibrationRow], points: Mapping[str, CalibrationPoint], source: str = ""
) -> Calibration:
    """The calibration of the rows' target on the CPU profile (calibration.py says what it holds);
    `points`: the calibration point of every workload the rows name."""
    first = points[rows[0].workload]
    observed = []
    for row in rows:
        point = points[row.workload]
        prior = prior_acceptance(row.candidate, point.known, row.fingerprint, GREEDY)
        measured = invert_mean_length(row.mean_acceptance_length, row.candidate.k, row.candidate.tree)
        observed.append((str(row.candidate.family), measured, prior))
    return Calibration(
        target_ref=first.known.target.ref,
        profile=first.deployment.profile.name,
        family_scale=fit_family_scale(observed),
        shapes=fit_shapes(rows),
        rows=tuple(rows),
        source=source,
    )


def predicted_speedup(
    point: CalibrationPoint, candidate: Candidate, calibration: Calibration | None
) -> float:
    """The predictor's latency speedup of `candidate` at the point (its profile's name as the GPU)."""
    estimate = predict(
        candidate,
        point.deployment,
        point.serving,
        point.known,
        gpu=point.deployment.profile.name,
        calibration=calibration,
    )
    return estimate.latency_speedup
