"""Measure a bench plan on speccore, in this process: the local source of the measuring
protocol (protocol.py).

Everything runs in one process on the fingerprint's prompts, through
speccore's one measuring protocol (:func:`speccore.bench.interleave`: warm-up, rotating
interleaved order, speedups as same-rep ratios, resume, a failing method dropped alone).
This module opens a plan's methods for it: the target (loaded through a
:class:`ModelCache`, so a long-running runner loads it once; a target that cannot load is
:class:`TargetLoadError`), the prompts encoded for it, and an engine per candidate (one
whose draft source cannot be built is a ``CandidateFailed``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from speccatalog.artifacts import find_head, is_head_id
from speccatalog.families.base import DraftSource
from speccore.bench import Method, Schedule, bench_engine, describe, engine_method
from speccore.candidates import speccore_candidate
from speccore.engine import Engine
from speccore.errors import SpecError
from speccore.model_cache import ModelCache, ModelLoadError, release_memory
from speccore.models import LoadedModel
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import ErrorStage
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.protocol import (
    BenchOutcome,
    CandidateFailed,
    Fields,
    MeasureError,
    RepCallback,
    RepRow,
    run,
    schedule,
)
from specprompts.corpora import candidate_datastore
from specprompts.sets import encode_for, prompts_for_model


class TargetLoadError(MeasureError):
    """The target model could not be loaded (error_stage ``model_load``)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorStage.MODEL_LOAD, message)


@dataclass(frozen=True, slots=True)
class Corpora:
    """Where a bench's uploaded corpora are: its tenant's part of the artifact store."""

    tenant_id: str | None
    artifact_root: Path | None


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

    `tenant_id` (the bench's) and `artifact_root` locate the corpora a rest candidate's
    draft may name (`ds-<hex>`).
    """
    source = LocalSource(plan, model_cache, device, dtype, Corpora(tenant_id, artifact_root))
    return run(plan, source, on_rep=on_rep, done=done)


@dataclass(slots=True)
class LocalSource:
    """The plan's methods as speccore engines on one target, loaded when the bench opens."""

    plan: BenchPlan
    model_cache: ModelCache
    device: str
    dtype: str
    corpora: Corpora
    needs_every_method: bool = False
    _target: LoadedModel | None = field(default=None, init=False)
    _prompt_ids: frozenset[str] = field(default=frozenset(), init=False)

    def fields(self, candidates: Mapping[str, Candidate]) -> Fields:
        return {}

    def open(self, stack: contextlib.ExitStack) -> Schedule:
        try:
            self._target = self.model_cache.get(self.plan.target.model_ref, self.device, self.dtype)
        except ModelLoadError as err:
            raise TargetLoadError(str(err)) from err
        reps, self._prompt_ids = _schedule(self.plan, self._target)
        return reps

    def baseline(self) -> Method:
        return engine_method(Engine(self._loaded()))

    def method(self, candidate: Candidate) -> Method:
        engine = candidate_engine(self._loaded(), candidate, self.plan, self._prompt_ids, self.corpora)
        return engine_method(engine)

    def evidence(self, live: Collection[str]) -> Fields:
        return {}

    def _loaded(self) -> LoadedModel:
        if self._target is None:
            raise RuntimeError("the local source decodes only once opened")
        return self._target


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
    return schedule(plan, [encode_for(target, p) for p in prompts]), frozenset(p.id for p in prompts)


# --- candidates -> speccore -----------------------------------------------------------


def candidate_engine(
    target: LoadedModel, candidate: Candidate, plan: BenchPlan, prompt_ids: frozenset[str], corpora: Corpora
) -> Engine:
    """The speccore engine for a candidate; CandidateFailed says why there is none."""
    try:
        spec = speccore_candidate(candidate)
    except SpecError as err:
        raise CandidateFailed(ErrorStage.VALIDATION, str(err)) from err
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
        raise CandidateFailed(
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
