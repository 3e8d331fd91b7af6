"""Scoring, ranking, the pareto front and the final winner of a T1 run.

A candidate's score is the priority-weighted mean of its throughput and latency
speedups (weights normalised to sum 1). The pareto front is over (speedup, higher is
better) x (extra memory, lower is better). The winner is the best *qualified* candidate:
measured, gate passed (a failed gate sets quality_preserved=0.0 and
error_stage="quality_regression" and disqualifies it whatever its speed) and faster
than the baseline. When the target could not be measured here, the winner is the
predicted best, flagged measured=False.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specops_schemas.api import Priorities
from specops_schemas.candidates import CandidateResult, GateOutcome, Measurement, Prediction, RankedCandidate
from specops_schemas.catalog import ErrorStage, GateMethod, Mode
from specops_schemas.events import CandidateFailure
from specops_services.predictor.model import Estimate


def rank(estimates: Iterable[Estimate], priorities: Priorities, mode: Mode) -> list[RankedCandidate]:
    """Best score first; ties go to less extra memory, then to the candidate id."""
    scored = sorted(
        ((priorities.score(e.throughput_speedup, e.latency_speedup), e) for e in estimates),
        key=lambda pair: (-pair[0], pair[1].extra_memory_bytes, pair[1].candidate.candidate_id),
    )
    return [
        RankedCandidate(
            candidate=e.candidate,
            prediction=Prediction(
                rank=i,
                score=s,
                acceptance_rate=e.acceptance,
                mean_acceptance_length=e.mean_acceptance_length,
                # Interactive runs are measured at batch 1: their speedup is the per-stream one.
                speedup=e.latency_speedup if mode == Mode.INTERACTIVE else e.throughput_speedup,
                extra_memory_bytes=e.extra_memory_bytes,
            ),
        )
        for i, (s, e) in enumerate(scored, start=1)
    ]


def pareto_front(points: Iterable[tuple[str, float, int]]) -> list[str]:
    """Ids of the (id, speedup, extra_memory_bytes) points no other point dominates, in input order."""
    pts = list(points)
    front = []
    for pid, speed, mem in pts:
        dominated = any(
            s >= speed and m <= mem and (s > speed or m < mem) for other, s, m in pts if other != pid
        )
        if not dominated:
            front.append(pid)
    return front


def predicted_front(ranked: Sequence[RankedCandidate]) -> list[str]:
    return pareto_front(
        (r.candidate.candidate_id, r.prediction.speedup, r.prediction.extra_memory_bytes) for r in ranked
    )


def assemble_results(
    ranked: Sequence[RankedCandidate],
    *,
    gate_method: GateMethod,
    measurements: Mapping[str, Measurement] | None = None,
    gates: Mapping[str, GateOutcome] | None = None,
    failures: Iterable[CandidateFailure] = (),
) -> list[CandidateResult]:
    """The candidates table in predicted-rank order, with measurements, gates and disqualifications.

    A measured candidate is disqualified when its gate failed (quality_regression), or
    when the run has a gate (anything but `skipped`) and it has no final verdict (quality_gate).
    """
    measurements = measurements or {}
    gates = gates or {}
    failed = {f.candidate_id: f for f in failures}
    rows = []
    for r in sorted(ranked, key=lambda r: r.prediction.rank):
        cid = r.candidate.candidate_id
        m, gate = measurements.get(cid), gates.get(cid)
        quality, stage, message = 1.0, None, None
        if cid in failed:
            stage, message = failed[cid].error_stage, failed[cid].message
        elif gate is not None and gate.passed is False:
            quality, stage = 0.0, ErrorStage.QUALITY_REGRESSION
            message = f"quality gate {gate.method} failed (score {gate.score}, threshold {gate.threshold})"
        elif m is not None and gate_method != GateMethod.SKIPPED and (gate is None or gate.passed is None):
            stage, message = ErrorStage.QUALITY_GATE, f"no final {gate_method} verdict for this candidate"
        rows.append(
            CandidateResult(
                candidate=r.candidate,
                prediction=r.prediction,
                measurement=m,
                gate=gate,
                quality_preserved=quality,
                error_stage=stage,
                error_message=message,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class Decision:
    """What `run.completed` reports."""

    measured: bool
    winner: CandidateResult | None
    candidates: list[CandidateResult]
    pareto_front: list[str]


def choose_winner(
    rows: Sequence[CandidateResult],
    *,
    priorities: Priorities,
    baseline: Measurement | None,
    min_speedup: float = 1.0,
) -> Decision:
    """The run's winner from `assemble_results` rows.

    With a baseline (the target ran here) only measured, qualified candidates whose
    measured speedup exceeds `min_speedup` may win, best measured score first. Without
    one, the best-ranked qualified candidate whose predicted speedup exceeds it wins,
    unmeasured.
    """
    qualified = [r for r in rows if r.error_stage is None and r.quality_preserved > 0.0]
    if baseline is None:
        eligible = [r for r in qualified if r.prediction.speedup > min_speedup]
        best = min(eligible, key=lambda r: r.prediction.rank, default=None)
        front = pareto_front(
            (r.candidate.candidate_id, r.prediction.speedup, r.prediction.extra_memory_bytes)
            for r in qualified
        )
        return Decision(measured=False, winner=best, candidates=list(rows), pareto_front=front)
    measured = [r for r in qualified if r.measurement is not None]
    points = [(r, r.measurement) for r in measured if r.measurement is not None]
    eligible_m = [(r, m) for r, m in points if m.speedup > min_speedup]
    best_pair = max(
        eligible_m,
        key=lambda p: (priorities.measured_score(p[1], baseline), -p[0].prediction.rank),
        default=None,
    )
    front = pareto_front((r.candidate.candidate_id, m.speedup, m.extra_memory_bytes) for r, m in points)
    return Decision(
        measured=True,
        winner=best_pair[0] if best_pair else None,
        candidates=list(rows),
        pareto_front=front,
    )
