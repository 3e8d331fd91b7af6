"""What the gate decodes (its sample) and the bound each method compares its score with."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from speccatalog.workloads import WORKLOADS
from speccore.errors import SpecError
from specops_schemas.catalog import GateMethod
from specops_schemas.events import BenchPlan
from specprompts.code import CodeTask


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Pass bounds of the product's gate table, one per measured method (field name = method)."""

    exact: float = 1.0  # min token agreement with the target's greedy output; lossless means all
    topk5: float = 0.95  # min top-5 agreement (greedy: share of tokens inside the target's top 5)
    logit_kl: float = 1e-3  # max mean KL(target || spec) per emitted token, nats
    mmlu_slice: float = 0.0  # max MMLU accuracy drop (baseline - candidate) on the slice
    # Max schema violations per 1k generated tokens *above the target's own rate*: a
    # small model breaks schemas by itself, and the gate judges what speculation adds.
    constraint_violation: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            # NaN compares false with every score; outcomes refuse NaN and inf on the wire.
            if not math.isfinite(getattr(self, f.name)):
                raise SpecError(f"threshold {f.name} must be a finite number")

    def of(self, method: GateMethod) -> float:
        if method.value not in {f.name for f in fields(self)}:
            raise SpecError(f"gate method '{method.value}' has no threshold")
        return float(getattr(self, method.value))


@dataclass(frozen=True, slots=True)
class GateSample:
    """What the gate decodes. The defaults are sized for CPU (seconds per method on 135M)."""

    workload: str = "chat"  # prompt set of exact / topk5 / logit_kl (speccatalog.workloads.WORKLOADS)
    n_prompts: int = 4
    max_new_tokens: int = 32
    seed: int = 0  # prompt selection and sampled decoding
    batch_size: int = 4  # prompts decoded together
    mmlu_questions: int = 20
    mmlu_new_tokens: int = 4  # the answer letter comes first
    structured_tasks: int = 4  # tasks of constraint_violation, JSON or code
    structured_new_tokens: int = 96  # enough for a small JSON object
    # Room for most HumanEval bodies; a completion the budget cuts is checked as a prefix.
    code_new_tokens: int = 128

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise SpecError(
                f"gate sample workload must be one of {', '.join(WORKLOADS)}, got {self.workload!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("workload", "seed") and value <= 0:
                raise SpecError(f"gate sample {f.name} must be positive, got {value}")

    def new_tokens_for(self, check: str) -> int:
        """The token budget of constraint_violation's replies under ``check``."""
        return self.code_new_tokens if check == CodeTask.check else self.structured_new_tokens

    @classmethod
    def for_plan(cls, plan: BenchPlan) -> GateSample:
        """The gate's default sample on the plan's workload and seed."""
        return cls(workload=plan.fingerprint.value, seed=plan.seed)
