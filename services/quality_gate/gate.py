"""The quality gate's seven methods behind one call; no bus, no SQL.

Five methods measure the candidate against the target on speccore: `exact`,
`topk5`, `logit_kl`, `mmlu_slice`, `constraint_violation`. `skipped` passes
without measuring and marks the outcome for the audit log; `pending` is the
transient state before a verdict (passed=None).

Every speccore family is lossless, so real candidates pass; speccore's opt-in
lossy acceptance rule (Candidate.options["lossy_accept_threshold"]) exists to show
that the gate fails what is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import JsonValue

from speccore.candidates import ignored_options
from speccore.engine import Engine
from speccore.models import LoadedModel
from speccore.sampling import SamplingParams
from specops_schemas.candidates import Candidate, GateOutcome
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.agreement import exact, topk5
from specops_services.quality_gate.constraints import constraint_violation
from specops_services.quality_gate.decoding import GatePrompt, Reference, build_engine
from specops_services.quality_gate.logit_kl import logit_kl
from specops_services.quality_gate.mmlu import mmlu_slice
from specops_services.quality_gate.sample import GateSample, Thresholds
from specprompts.sets import ConstraintTask

Method = Callable[[Reference, Engine, SamplingParams, float], GateOutcome]

MEASURED: dict[GateMethod, Method] = {
    GateMethod.EXACT: exact,
    GateMethod.TOPK5: topk5,
    GateMethod.LOGIT_KL: logit_kl,
    GateMethod.MMLU_SLICE: mmlu_slice,
    GateMethod.CONSTRAINT_VIOLATION: constraint_violation,
}
DEFAULT_SKIP_REASON = "quality gate disabled for this run (goal.quality_gate = skipped)"


def skipped(reason: str = DEFAULT_SKIP_REASON) -> GateOutcome:
    """A pass without measurement; `audit` tells the audit service to record the opt-out."""
    return GateOutcome(
        method=GateMethod.SKIPPED, passed=True, details={"audit": True, "reason": reason, "measured": False}
    )


def pending() -> GateOutcome:
    """The placeholder a candidate carries while its gate is measured."""
    return GateOutcome(method=GateMethod.PENDING, passed=None, details={"reason": "awaiting evaluation"})


class QualityGate:
    """Gates candidates against one target; the target's own outputs are decoded once and shared."""

    def __init__(
        self,
        target: LoadedModel,
        sample: GateSample | None = None,
        thresholds: Thresholds | None = None,
        *,
        prompts: Sequence[GatePrompt] | None = None,
        tasks: Sequence[ConstraintTask] | None = None,
    ) -> None:
        self.sample = sample or GateSample()
        self.thresholds = thresholds or Thresholds()
        self.reference = Reference(target, self.sample, prompts, tasks)

    def evaluate(
        self,
        method: GateMethod | str,
        candidate: Candidate,
        sampling: SamplingParams | None = None,
        *,
        thresholds: Thresholds | None = None,
        reason: str = DEFAULT_SKIP_REASON,
    ) -> GateOutcome:
        """The outcome of ``method`` on ``candidate``; SpecError if it cannot run here.

        ``sampling`` applies to topk5, logit_kl and constraint_violation; exact and
        mmlu_slice decode greedily by definition. ``thresholds`` overrides the
        gate's own for this call (runs sharing a target may set different bounds).
        """
        method = GateMethod(method)
        if method == GateMethod.SKIPPED:
            return skipped(reason)
        if method == GateMethod.PENDING:
            return pending()
        engine = build_engine(self.reference.target, candidate)
        bound = (thresholds or self.thresholds).of(method)
        outcome = MEASURED[method](self.reference, engine, sampling or SamplingParams(), bound)
        extra: dict[str, JsonValue] = {
            "candidate_id": candidate.candidate_id,
            "sample_seed": self.sample.seed,
        }
        unused = ignored_options(candidate)
        if unused:
            extra["ignored_options"] = list(unused)
        return outcome.model_copy(update={"details": {**outcome.details, **extra}})


def evaluate(
    method: GateMethod | str,
    *,
    target: LoadedModel,
    candidate: Candidate,
    sampling: SamplingParams | None = None,
    sample: GateSample | None = None,
    thresholds: Thresholds | None = None,
    reason: str = DEFAULT_SKIP_REASON,
) -> GateOutcome:
    """One method on one candidate (a QualityGate shares the target's outputs across candidates)."""
    return QualityGate(target, sample, thresholds).evaluate(method, candidate, sampling, reason=reason)
