"""One bench's measuring protocol, whatever decodes it: the reps left to measure, each
method opened from its source, speccore.bench.interleave over them, the failures, and the
outcome (summaries in plan order).

A :class:`Source` is where a bench's methods decode: in-process speccore (measure.py) or
engine servers, one per method (measure_http.py). The protocol is the same for both:

- Resuming: reps already stored come back in ``done`` and are not rerun; summaries are
  computed from stored and new rows alike (:func:`summarise`). A rep with any method left
  to measure reruns the baseline as well, so every speedup stays a ratio measured in one
  run (speccore.bench.interleave).
- A candidate its source cannot open (:class:`CandidateFailed`) or whose decoding fails
  becomes a ``CandidateFailure`` and the others go on; a baseline that cannot be opened or
  run fails the bench (:class:`MeasureError`, with the stage the run fails at).
- A source may need every candidate opened even when its reps are all stored
  (``needs_every_method``: the gate's evidence over HTTP is gathered after the reps), and
  adds Measurement fields of its own: before decoding (``fields``: an engine server's
  launch flags) and after the reps (``evidence``).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from speccore.bench import BaselineFailed, Method, RepRun, Schedule, interleave
from speccore.metrics import GenerationMetrics
from speccore.sampling import SamplingParams
from specops_schemas.candidates import BASELINE_ID, Candidate, Measurement
from specops_schemas.catalog import ErrorStage, Mode
from specops_schemas.events import BenchPlan, CandidateFailure, RepMetrics

log = logging.getLogger(__name__)

# Rows of one generate() call in batch mode; interactive mode is batch=1.
BATCH_SIZE = 8
# Measurement fields per method id, besides its reps' summary.
Fields = dict[str, dict[str, Any]]


class MeasureError(Exception):
    """The whole bench failed; ``error_stage`` is what the run fails with."""

    def __init__(self, error_stage: ErrorStage, message: str) -> None:
        super().__init__(message)
        self.error_stage = error_stage
        self.message = message


class CandidateFailed(Exception):
    """A source cannot open a candidate's method; ``error_stage`` is what the candidate fails with."""

    def __init__(self, error_stage: ErrorStage, message: str) -> None:
        super().__init__(message)
        self.error_stage = error_stage

    def failure(self, candidate_id: str) -> CandidateFailure:
        return CandidateFailure(candidate_id=candidate_id, error_stage=self.error_stage, message=str(self))


@dataclass(frozen=True, slots=True)
class RepRow:
    """One measured rep of one method, as published and stored."""

    candidate_id: str  # or BASELINE_ID
    rep: int
    metrics: RepMetrics
    speedup: float | None  # tokens/s over the baseline's in the same rep; None for the baseline

    @classmethod
    def of(cls, run: RepRun) -> RepRow:
        """The row of one method's measured rep (in-process or over HTTP alike)."""
        return cls(run.method, run.rep, rep_metrics(run.metrics, run.seconds), run.speedup)


# Called once per newly measured row, at the end of its rep, the baseline first.
RepCallback = Callable[[RepRow], None]


@dataclass(frozen=True, slots=True)
class BenchOutcome:
    """The measured fields of a ``BenchCompleted`` payload."""

    baseline: Measurement
    results: list[Measurement]  # in plan order
    failures: list[CandidateFailure]


class Source(Protocol):
    """Where a bench's methods decode (see the module's docstring)."""

    @property
    def needs_every_method(self) -> bool:
        """Open every candidate, even one whose reps are all stored."""
        ...

    def fields(self, candidates: Mapping[str, Candidate]) -> Fields:
        """Per method, Measurement fields known before anything decodes."""
        ...

    def open(self, stack: contextlib.ExitStack) -> Schedule:
        """Load what the bench decodes with (released by ``stack``); the schedule of its reps.
        MeasureError if the bench cannot be measured at all."""
        ...

    def baseline(self) -> Method:
        """The baseline's method; MeasureError if it cannot be opened."""
        ...

    def method(self, candidate: Candidate) -> Method:
        """A candidate's method; CandidateFailed if it cannot be opened."""
        ...

    def evidence(self, live: Collection[str]) -> Fields:
        """After the reps, per method still measured (``live``, the baseline included),
        Measurement fields gathered from its opened method."""
        ...


def schedule(plan: BenchPlan, prompts: list[list[int]]) -> Schedule:
    """The plan's reps over `prompts` (token ids in process, prompt indices over HTTP)."""
    return Schedule(
        prompts=prompts,
        reps=plan.reps,
        max_new_tokens=plan.max_new_tokens,
        sampling=SamplingParams.of(plan.sampling),
        seed=plan.seed,
        batch_size=BATCH_SIZE if plan.mode == Mode.BATCH else 1,
    )


def run(plan: BenchPlan, source: Source, *, on_rep: RepCallback, done: Iterable[RepRow] = ()) -> BenchOutcome:
    """Measure every rep of ``plan`` not in ``done`` on ``source``, reporting each new row
    through ``on_rep`` (an exception it raises stops the bench)."""
    stored = check_done(plan, done)
    rows = list(stored.values())
    failures: dict[str, CandidateFailure] = {}
    candidates = {c.candidate_id: c for c in plan.candidates}
    pending = [r for r in range(plan.reps) if any((m, r) not in stored for m in [BASELINE_ID, *candidates])]
    fields = source.fields(candidates)
    every = source.needs_every_method
    if not pending and not every:
        return outcome(plan, rows, failures, fields)
    with contextlib.ExitStack() as stack:
        opened = source.open(stack)
        methods: dict[str, Method] = {BASELINE_ID: source.baseline()}
        for cid, candidate in candidates.items():
            measured = all((cid, r) in stored for r in pending)
            if measured and not every:
                continue
            try:
                methods[cid] = source.method(candidate)
            except CandidateFailed as err:
                if not measured:
                    failures[cid] = err.failure(cid)
                else:  # its reps are stored: still measured, but with no evidence its gate fails
                    log.warning("run %s: %s could not be opened again: %s", plan.run_id, cid, err)

        def report(rep: RepRun) -> None:
            row = RepRow.of(rep)
            on_rep(row)
            rows.append(row)

        try:
            dropped = interleave(
                opened, dict(methods), report, baseline=BASELINE_ID, stored=lambda m, r: (m, r) in stored
            )
        except BaselineFailed as err:
            raise MeasureError(ErrorStage.BENCHMARK, str(err)) from err
        for cid, why in dropped.items():
            failures[cid] = CandidateFailure(candidate_id=cid, error_stage=ErrorStage.BENCHMARK, message=why)
        for cid, extra in source.evidence([m for m in methods if m not in failures]).items():
            fields.setdefault(cid, {}).update(extra)
    return outcome(plan, rows, failures, fields)


def outcome(
    plan: BenchPlan,
    rows: Iterable[RepRow],
    failures: dict[str, CandidateFailure],
    fields: Mapping[str, Mapping[str, Any]],
) -> BenchOutcome:
    """The bench's summaries from its rep rows, stored and new, in plan order, each with
    its method's `fields` from the source (Source.fields, Source.evidence)."""
    by_method: dict[str, list[RepRow]] = {}
    for row in rows:
        by_method.setdefault(row.candidate_id, []).append(row)
    order = [c.candidate_id for c in plan.candidates]

    def summary(method: str) -> Measurement:
        return summarise(by_method[method]).model_copy(update=dict(fields.get(method, {})))

    return BenchOutcome(
        baseline=summary(BASELINE_ID),
        results=[summary(m) for m in order if m not in failures and m in by_method],
        failures=[failures[m] for m in order if m in failures],
    )


def summarise(rows: Sequence[RepRow]) -> Measurement:
    """The summary of one method's rep rows (any order); pure, so stored rows can be re-summarised."""
    if not rows:
        raise ValueError("no rep rows to summarise")
    candidate_id = rows[0].candidate_id
    if any(r.candidate_id != candidate_id for r in rows):
        raise ValueError("rep rows of different candidates cannot be summarised together")
    if len({r.rep for r in rows}) != len(rows):
        raise ValueError(f"rep rows of {candidate_id} repeat a rep")
    ordered = sorted(rows, key=lambda r: r.rep)
    ms = [r.metrics for r in ordered]
    speedup_mean: float | None = None
    speedup_stdev: float | None = None
    if candidate_id == BASELINE_ID:
        speedup = 1.0
    else:
        ratios = [r.speedup for r in ordered]
        if any(s is None for s in ratios):
            raise ValueError(f"a rep row of candidate {candidate_id} has no speedup")
        per_rep = [s for s in ratios if s is not None]
        speedup = statistics.median(per_rep)
        speedup_mean = statistics.fmean(per_rep)
        speedup_stdev = statistics.stdev(per_rep) if len(per_rep) > 1 else 0.0
    tps = [m.tokens_per_s for m in ms]
    drafted = sum(m.drafted_tokens for m in ms)
    accepted = sum(m.accepted_tokens for m in ms)
    steps = sum(m.verify_steps for m in ms)
    drafted_at = _sum_lists(m.drafted_per_position for m in ms)
    accepted_at = _sum_lists(m.accepted_per_position for m in ms)
    return Measurement(
        candidate_id=candidate_id,
        reps=len(ms),
        tokens_per_s=statistics.fmean(tps),
        tokens_per_s_stdev=statistics.stdev(tps) if len(tps) > 1 else 0.0,
        speedup=speedup,
        speedup_mean=speedup_mean,
        speedup_stdev=speedup_stdev,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_acceptance_length=(accepted + steps) / steps if steps else 0.0,
        per_position_acceptance=[a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at, strict=True)],
        ttft_s=statistics.fmean(m.ttft_s for m in ms),
        tpot_s=statistics.fmean(m.tpot_s for m in ms),
        extra_memory_bytes=max(m.extra_memory_bytes for m in ms),
    )


def rep_metrics(ms: Sequence[GenerationMetrics], wall_s: float) -> RepMetrics:
    """One method's metrics over a rep's prompts: counts and times summed, `wall_s` as total time.

    ttft_s is the mean over prompts; tpot_s is decode time over decode tokens
    (every token after each prompt's first); extra memory is the peak.
    """
    if not ms:
        raise ValueError("a rep needs at least one generation")
    drafted_at = _sum_lists(m.drafted_per_position for m in ms)
    accepted_at = _sum_lists(m.accepted_per_position for m in ms)
    drafted = sum(m.drafted_tokens for m in ms)
    accepted = sum(m.accepted_tokens for m in ms)
    steps = sum(m.verify_steps for m in ms)
    new_tokens = sum(m.new_tokens for m in ms)
    decode_tokens = sum(m.new_tokens - 1 for m in ms if m.new_tokens > 1)
    decode_s = sum(max(m.total_time_s - m.ttft_s, 0.0) for m in ms if m.new_tokens > 1)
    return RepMetrics(
        prompt_tokens=sum(m.prompt_tokens for m in ms),
        cached_prompt_tokens=sum(m.cached_prompt_tokens for m in ms),
        new_tokens=new_tokens,
        verify_steps=steps,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        rollbacks=sum(m.rollbacks for m in ms),
        draft_time_s=sum(m.draft_time_s for m in ms),
        verify_time_s=sum(m.verify_time_s for m in ms),
        ttft_s=statistics.fmean(m.ttft_s for m in ms),
        total_time_s=wall_s,
        extra_memory_bytes=max(m.extra_memory_bytes for m in ms),
        drafted_per_position=drafted_at,
        accepted_per_position=accepted_at,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_acceptance_length=(accepted + steps) / steps if steps else 0.0,
        per_position_acceptance=[a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at, strict=True)],
        tpot_s=decode_s / decode_tokens if decode_tokens else 0.0,
        tokens_per_s=new_tokens / wall_s if wall_s > 0 else 0.0,
    )


def check_done(plan: BenchPlan, done: Iterable[RepRow]) -> dict[tuple[str, int], RepRow]:
    known = {BASELINE_ID, *(c.candidate_id for c in plan.candidates)}
    stored: dict[tuple[str, int], RepRow] = {}
    for row in done:
        if row.candidate_id not in known or not 0 <= row.rep < plan.reps:
            raise ValueError(f"stored rep {row.rep} of '{row.candidate_id}' is not part of this plan")
        stored[(row.candidate_id, row.rep)] = row
    return stored


def _sum_lists(lists: Iterable[list[int]]) -> list[int]:
    total: list[int] = []
    for values in lists:
        total.extend([0] * (len(values) - len(total)))
        for i, v in enumerate(values):
            total[i] += v
    return total
