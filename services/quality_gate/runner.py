"""The service's gate on real models: settings, the cached target and one blocking call per candidate.

`GateRunner.evaluate` blocks (it decodes on speccore); the app calls it in a worker
thread. The target stays loaded between benches (speccore's ModelCache),
and so does the QualityGate of the last plan, whose reference outputs (the target
decoding alone) are then shared by every candidate of that plan.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
from pydantic import Field

from speccatalog import families
from speccatalog.families.base import DraftSource
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from specops_schemas.candidates import Candidate, GateOutcome
from specops_schemas.catalog import GateMethod
from specops_schemas.events import BenchPlan
from specops_services.quality_gate import flow
from specops_services.quality_gate.logic import QualityGate, pending, skipped
from specops_services.quality_gate.settings import GateSample, sampling_params
from specplatform.settings import Settings
from specprompts.corpora import builtin_datastore
from specprompts.sets import prompts_for_model


class QualityGateSettings(Settings):
    """`SPECOPS_THREADS`, `SPECOPS_GATE_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings).

    The sample defaults keep a gate at seconds per candidate for a 135M target on
    two CPU cores; raise them on a GPU for a tighter estimate.
    """

    threads: int = Field(2, ge=1, le=1024, description="CPU threads PyTorch may use.")
    gate_device: str = Field("auto", description="Where the target runs: auto, cpu or cuda.")
    gate_dtype: str = Field("auto", description="Target dtype: auto, float32, bfloat16 or float16.")
    gate_models: int = Field(1, ge=1, le=16, description="Targets kept loaded between benches.")
    gate_prompts: int = Field(4, ge=1, le=10_000, description="Prompts of exact / topk5 / logit_kl.")
    gate_new_tokens: int = Field(32, ge=1, le=32_768, description="Tokens decoded per gate prompt.")
    gate_batch_size: int = Field(4, ge=1, le=1024, description="Gate prompts decoded together.")
    gate_mmlu_questions: int = Field(20, ge=1, le=10_000, description="Questions of mmlu_slice.")
    gate_structured_tasks: int = Field(4, ge=1, le=10_000, description="Tasks of constraint_violation.")

    def sample(self, plan: BenchPlan) -> GateSample:
        """The gate's sample for a plan: its workload and seed, these sizes."""
        return dataclasses.replace(
            GateSample.for_plan(plan),
            n_prompts=self.gate_prompts,
            max_new_tokens=self.gate_new_tokens,
            batch_size=self.gate_batch_size,
            mmlu_questions=self.gate_mmlu_questions,
            structured_tasks=self.gate_structured_tasks,
        )


class GateRunner:
    """Gates one candidate at a time against its plan's target. Blocking; thread-safe."""

    def __init__(self, settings: QualityGateSettings, models: ModelCache | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelCache(settings.gate_models)
        self._lock = threading.Lock()
        self._gate: tuple[tuple[str, GateSample], QualityGate] | None = None

    def evaluate(self, plan: BenchPlan, candidate: Candidate) -> GateOutcome:
        """The plan's gate method on `candidate`.

        `skipped` and `pending` load nothing. A candidate the gate cannot run on gets
        a failed verdict (flow.gate_unavailable); a target that cannot be loaded
        raises speccore.model_cache.ModelLoadError, which fails the whole run.
        """
        method = plan.quality_gate
        if method == GateMethod.SKIPPED:
            return skipped()
        if method == GateMethod.PENDING:
            return pending()
        with self._lock:
            # Worker threads start with PyTorch's default; the service's budget applies to each.
            torch.set_num_threads(self.settings.threads)
            gate = self._gate_for(plan)
            try:
                resolved = _with_datastore(gate.reference.target, plan, candidate)
                return gate.evaluate(method, resolved, sampling_params(plan.sampling))
            # Whatever the candidate's engine raises (bad options, a draft that does not
            # load, OOM, a proposer bug) costs that candidate, not the run; the error is
            # kept in the verdict's details.
            except Exception as err:
                return flow.gate_unavailable(method, candidate, err)

    def _gate_for(self, plan: BenchPlan) -> QualityGate:
        target = self.models.get(plan.target.model_ref, self.settings.gate_device, self.settings.gate_dtype)
        key = (plan.target.model_ref, self.settings.sample(plan))
        if self._gate is None or self._gate[0] != key or self._gate[1].reference.target is not target:
            self._gate = (key, QualityGate(target, key[1]))
        return self._gate[1]


def _with_datastore(target: LoadedModel, plan: BenchPlan, candidate: Candidate) -> Candidate:
    """A rest candidate with its built-in datastore (`builtin:<workload>` or none) as a file path:
    the same file the benchmark-runner measured with (specprompts.corpora.builtin_datastore)."""
    if families.family(candidate.family).draft_source != DraftSource.DATASTORE:
        return candidate
    prompts = prompts_for_model(
        target, str(plan.fingerprint), plan.n_prompts, max_new_tokens=plan.max_new_tokens, seed=plan.seed
    )
    path = builtin_datastore(target, candidate.draft, str(plan.fingerprint), frozenset(p.id for p in prompts))
    return candidate if path is None else candidate.model_copy(update={"draft": str(path)})
