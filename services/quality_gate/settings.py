"""Quality-gate settings: the runtime's connection settings plus the gate's own knobs."""

from __future__ import annotations

import dataclasses

from pydantic import Field

from specops_schemas.events import BenchPlan
from specops_services.quality_gate.sample import GateSample
from specplatform.hostlock import MeasureLockDir
from specplatform.settings import Settings, service_settings


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
    measure_lock_dir: MeasureLockDir
    gate_pool_size: int = Field(4, ge=2, le=100, description="Largest number of Postgres connections.")

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


def gate_settings(given: Settings | None = None) -> QualityGateSettings:
    """The gate's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(QualityGateSettings, given)
