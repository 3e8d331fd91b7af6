"""Measure a bench plan on speccore: the baseline and every candidate, rep by rep.

DESIGN.md §10: everything runs in one process on the fingerprint's prompts, through
speccore's one measuring protocol (:func:`speccore.bench.interleave`: warm-up,
rotating interleaved order, speedups as same-rep ratios, resume, a failing method
dropped alone). This module maps a plan onto it (prompts, engines) and its runs onto
the service's wire format (:class:`RepRow`, :class:`~specops_schemas.candidates.Measurement`).

Resuming: reps already stored come back in ``done`` and are not rerun; summaries
are computed from stored and new rows alike (:func:`summarise`). A rep with any
method left to measure reruns the baseline as well, so every speedup stays a
ratio measured in one run; the baseline's row is reported again only if it was
not stored.

The target is loaded through a :class:`ModelCache`, so a long-running runner loads
it once. A candidate that cannot be built or run becomes a ``CandidateFailure``
and the others go on; a target that cannot load, or a baseline that cannot run,
raises :class:`MeasureError` with the stage the run failed at.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speccatalog.artifacts import find_head, is_head_id
from speccatalog.families.base import DraftSource
from speccore.bench import (
    BaselineFailed,
    Method,
    RepRun,
    Schedule,
    bench_engine,
    describe,
    engine_method,
    interleave,
)
from speccore.candidates import speccore_candidate
from speccore.engine import Engine
from speccore.errors import SpecError
from speccore.metrics import GenerationMetrics
from speccore.model_cache import ModelCache, ModelLoadError, release_memory
from speccore.models import LoadedModel
from speccore.sampling import SamplingParams
from specops_schemas.candidates import BASELINE_ID, Candidate, Measurement, Sampling
from specops_schemas.catalog import ErrorStage, Mode
from specops_schemas.events import BenchPlan, CandidateFailure, RepMetrics
from specprompts.corpora import candidate_datastore
from specprompts.sets import encode_for, prompts_for_model

# Rows of one generate() call in batch mode; interactive mode is batch=1.
BATCH_SIZE = 8


class MeasureError(Exception):
    """The whole bench failed; ``error_stage`` is what the run fails with."""

    def __init__(self, error_stage: ErrorStage, message: str) -> None:
        super().__init__(message)
        self.error_stage = error_stage
        self.message = message


class TargetLoadError(MeasureError):
    """The target model could not be loaded (error_stage ``model_load``)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorStage.MODEL_LOAD, message)


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


def measure(
    plan: BenchPlan,
    *,
    model_cache: ModelCache,
    on_rep: RepCallback,
    done: Iterable[RepRow] = (),
    device: str = "auto",
    dtype: str = "auto",
    tenant_id: str | None = None,
    artifact_root: Path | None = None,
) -> BenchOutcome:
    """Measure every rep of `plan` not in `done`, reporting each new row through `on_rep`.

    An exception `on_rep` raises stops the bench. `tenant_id` (the bench's) and
    `artifact_root` locate the corpora a rest candidate's draft may name (`ds-<hex>`).
    """
    stored = check_done(plan, done)
    rows = list(stored.values())
    failures: dict[str, CandidateFailure] = {}
    candidates = {c.candidate_id: c for c in plan.candidates}
    pending = [r for r in range(plan.reps) if any((m, r) not in stored for m in [BASELINE_ID, *candidates])]
    if pending:
        try:
            target = model_cache.get(plan.target.model_ref, device, dtype)
        except ModelLoadError as err:
            raise TargetLoadError(str(err)) from err
        schedule, prompt_ids = _schedule(plan, target)
        methods: dict[str, Method] = {BASELINE_ID: engine_method(Engine(target))}
        for cid, candidate in candidates.items():
            if all((cid, r) in stored for r in pending):
                continue
            try:
                methods[cid] = engine_method(
                    _engine(target, candidate, plan, prompt_ids, Corpora(tenant_id, artifact_root))
                )
            except _CandidateFailed as err:
                failures[cid] = err.failure(cid)

        def report(run: RepRun) -> None:
            row = RepRow.of(run)
            on_rep(row)
            rows.append(row)

        try:
            dropped = interleave(
                schedule, methods, report, baseline=BASELINE_ID, stored=lambda m, r: (m, r) in stored
            )
        except BaselineFailed as err:
            raise MeasureError(ErrorStage.BENCHMARK, str(err)) from err
        for cid, why in dropped.items():
            failures[cid] = CandidateFailure(candidate_id=cid, error_stage=ErrorStage.BENCHMARK, message=why)
    return outcome(plan, rows, failures)


def outcome(
    plan: BenchPlan,
    rows: Iterable[RepRow],
    failures: dict[str, CandidateFailure],
    served: Mapping[str, Mapping[str, Any]] | None = None,
) -> BenchOutcome:
    """The bench's summaries from its rep rows, stored and new, in plan order.

    `served` (benches over HTTP): per method, the Measurement fields measured on its
    server besides the reps (its launch flags, the gate's evidence).
    """
    by_method: dict[str, list[RepRow]] = {}
    for row in rows:
        by_method.setdefault(row.candidate_id, []).append(row)
    extra = served or {}
    order = [c.candidate_id for c in plan.candidates]

    def summary(method: str) -> Measurement:
        return summarise(by_method[method]).model_copy(update=dict(extra.get(method, {})))

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


def sampling_params(sampling: Sampling) -> SamplingParams:
    return SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)


def _schedule(plan: BenchPlan, target: LoadedModel) -> tuple[Schedule, frozenset[str]]:
    """The plan's prompts, encoded for the target, as speccore measures them; and their ids."""
    try:
        prompts = prompts_for_model(
            target,
            str(plan.fingerprint),
            plan.n_prompts,
            max_new_tokens=plan.max_new_tokens,
            seed=plan.seed,
        )
    except SpecError as err:
        raise MeasureError(ErrorStage.VALIDATION, f"no prompt set for this plan: {err}") from err
    schedule = Schedule(
        prompts=[encode_for(target, p) for p in prompts],
        reps=plan.reps,
        max_new_tokens=plan.max_new_tokens,
        sampling=sampling_params(plan.sampling),
        seed=plan.seed,
        batch_size=BATCH_SIZE if plan.mode == Mode.BATCH else 1,
    )
    return schedule, frozenset(p.id for p in prompts)


# --- candidates -> speccore -----------------------------------------------------------


class _CandidateFailed(Exception):
    def __init__(self, error_stage: ErrorStage, message: str) -> None:
        super().__init__(message)
        self.error_stage = error_stage

    def failure(self, candidate_id: str) -> CandidateFailure:
        return CandidateFailure(candidate_id=candidate_id, error_stage=self.error_stage, message=str(self))


@dataclass(frozen=True, slots=True)
class Corpora:
    """Where a bench's uploaded corpora are: its tenant's part of the artifact store."""

    tenant_id: str | None
    artifact_root: Path | None


def _engine(
    target: LoadedModel, candidate: Candidate, plan: BenchPlan, prompt_ids: frozenset[str], corpora: Corpora
) -> Engine:
    """The speccore engine for a candidate; _CandidateFailed says why there is none."""
    try:
        spec = speccore_candidate(candidate)
    except SpecError as err:
        raise _CandidateFailed(ErrorStage.VALIDATION, str(err)) from err
    config = spec.config
    try:
        if spec.source == DraftSource.DATASTORE:
            # A built-in corpus leaves the measured prompts' conversations out; an uploaded one
            # is indexed with this target's tokenizer on first use.
            built = candidate_datastore(
                target,
                config.datastore,
                str(plan.fingerprint),
                prompt_ids,
                tenant_id=corpora.tenant_id,
                artifact_root=corpora.artifact_root,
            )
            if built is not None:
                config = dataclasses.replace(config, datastore=str(built))
        elif spec.source == DraftSource.HEAD and is_head_id(config.head):
            # A tenant's registry head (T3): its trained artifact in the tenant's part of the store.
            config = dataclasses.replace(config, head=str(registry_head(str(config.head), corpora)))
        return bench_engine(target, spec.family, config)
    except (SpecError, OSError, RuntimeError, MemoryError) as err:
        release_memory()
        raise _CandidateFailed(
            ErrorStage.MODEL_LOAD, f"cannot load its draft source: {describe(err)}"
        ) from err


def registry_head(head_id: str, corpora: Corpora) -> Path:
    """The trained directory of registry head ``head_id`` among the bench's tenant's heads."""
    found = None
    if corpora.tenant_id is not None and corpora.artifact_root is not None:
        found = find_head(corpora.artifact_root, corpora.tenant_id, head_id)
    if found is None:
        raise SpecError(
            f"head {head_id} has no trained artifact in tenant {corpora.tenant_id}'s artifact store "
            f"({corpora.artifact_root}); set SPECOPS_ARTIFACT_DIR to the head-trainer's store"
        )
    return found


# --- helpers ----------------------------------------------------------------------------


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
