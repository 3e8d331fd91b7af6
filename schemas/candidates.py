"""A speculative configuration and what is known about it: predicted, measured, gated."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, JsonValue, model_validator

from speccatalog.workloads import temperature
from specops_schemas.base import Fraction, Id, Model
from specops_schemas.catalog import ErrorStage, Family, GateMethod

# Bench reps and measurements of the no-speculation reference use this candidate id.
BASELINE_ID = "baseline"


class Sampling(Model):
    """Sampling parameters of a measurement (temperature 0 is greedy)."""

    temperature: float = Field(0.0, ge=0.0, description="Softmax temperature; 0 means greedy decoding.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables top-k.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass kept; 1 disables top-p.")

    @classmethod
    def for_fingerprint(cls, fingerprint: str) -> Sampling:
        """How a fingerprint's benches sample, T1's and T2's alike, so that a tuned winner is
        measured as its run was: at the temperature its endpoints serve at."""
        return cls(temperature=temperature(fingerprint))


class Candidate(Model):
    """One point of the catalog: family x draft source x k x tree shape x options."""

    candidate_id: Id = Field(description="Id of this configuration, unique within its run.")
    family: Family = Field(description="Speculative-decoding algorithm family.")
    draft: str | None = Field(
        None,
        max_length=512,
        description="Draft source: a model ref, `self:<layers>`, a head registry id or a datastore id; "
        "None for families that draft from the target alone (ngram, lookahead, mtp).",
    )
    k: int = Field(ge=1, le=64, description="Speculative tokens per verify step (tree depth for trees).")
    tree: list[int] | None = Field(
        None,
        min_length=1,
        description="Children per node at each depth, e.g. [4, 2, 1]; None drafts a chain of k tokens.",
    )
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Family-specific knobs, e.g. {'min_match': 2} for ngram or {'topk': 8} for eagle.",
    )


class Prediction(Model):
    """What the acceptance predictor expects of a candidate before any measurement."""

    rank: int = Field(ge=1, description="1 is the best score under the run's priorities.")
    score: float = Field(description="Priority-weighted score the ranking sorts by (higher is better).")
    acceptance_rate: Fraction = Field(description="Predicted accepted / drafted tokens.")
    mean_acceptance_length: float = Field(
        ge=1.0, description="Predicted tokens per verify step, bonus token included: (1 - a^(k+1)) / (1 - a)."
    )
    speedup: float = Field(gt=0.0, description="Predicted decode tokens/s relative to no speculation.")
    extra_memory_bytes: int = Field(
        ge=0, description="Predicted memory on top of the target and its KV cache."
    )


class RankedCandidate(Model):
    """A candidate with its prediction, as listed by `run.predicted`."""

    candidate: Candidate = Field(description="The configuration.")
    prediction: Prediction = Field(description="The predictor's expectation for it.")


class Top5Evidence(Model):
    """What the `topk5` gate decides on for a candidate measured on an engine server: its own
    outputs (the plan's sampling), read teacher-forced by the baseline server, which reports
    the target's most likely tokens at every position (vLLM's `prompt_logprobs`)."""

    prompts: int = Field(ge=1, description="Prompts the candidate decoded.")
    tokens: int = Field(ge=0, description="Output tokens scored.")
    inside_top5: int = Field(ge=0, description="Output tokens among the target's 5 most likely.")
    expected_inside_top5: float = Field(
        ge=0.0,
        description="How many of them the target's own sampling puts there in expectation: the tokens "
        "when greedy; sampled, the top-5 share of the target's 20 most likely tokens under the plan's "
        "temperature, top-k and top-p at each position (the rest of the vocabulary left out, which can "
        "only raise it: the stricter side).",
    )
    worst_prompt_share: Fraction = Field(description="The lowest share inside the top 5 of one prompt.")


class MmluEvidence(Model):
    """What `mmlu_slice` decides on: the same seeded MMLU questions answered greedily by the
    target alone and with the candidate (answers are indices into A-D; None: no letter)."""

    seed: int = Field(description="Seed of the question sample.")
    question_ids: list[str] = Field(min_length=1, description="The questions asked, in order.")
    truth: list[int] = Field(description="Each question's correct answer.")
    baseline_answers: list[int | None] = Field(description="The target's own answers.")
    candidate_answers: list[int | None] = Field(description="The answers decoded with the candidate.")

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        n = len(self.question_ids)
        if not len(self.truth) == len(self.baseline_answers) == len(self.candidate_answers) == n:
            raise ValueError("truth and both answer lists need one entry per question")
        return self


class StructuredEvidence(Model):
    """What `constraint_violation` decides on: the same tasks decoded by the target alone and with
    the candidate, each reply's violations counted: against its JSON Schema
    (specprompts.structured), or, for code, whether the completion parses (specprompts.code)."""

    check: Literal["json_schema", "python_syntax"] = Field(
        "json_schema",
        description="What each reply is checked against: `json_schema`, its task's JSON Schema (one "
        "violation per schema error, a reply that is not one JSON value counts one); `python_syntax`, "
        "Python's compiler on the function stub plus its completion (one violation per completion "
        "that does not parse; the `code` fingerprint).",
    )
    task_ids: list[str] = Field(min_length=1, description="The tasks decoded, in order.")
    baseline_violations: list[int] = Field(description="Violations of the target's own reply, per task.")
    candidate_violations: list[int] = Field(description="Violations of the candidate's reply, per task.")
    candidate_problems: list[str | None] = Field(
        description="The first problem found in the candidate's reply, per task (None: valid)."
    )
    baseline_tokens: int = Field(ge=0, description="Tokens the target generated over all tasks.")
    candidate_tokens: int = Field(ge=0, description="Tokens generated with the candidate over all tasks.")

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        n = len(self.task_ids)
        lists = (self.baseline_violations, self.candidate_violations, self.candidate_problems)
        if any(len(x) != n for x in lists):
            raise ValueError("violations and problems need one entry per task")
        return self


class Measurement(Model):
    """Summary of a candidate's reps in one bench (speedups are within-rep ratios to the baseline)."""

    candidate_id: str = Field(description=f"Candidate measured, or '{BASELINE_ID}' for no speculation.")
    reps: int = Field(ge=1, description="Number of reps summarised.")
    tokens_per_s: float = Field(ge=0.0, description="Mean decode tokens/s across reps.")
    tokens_per_s_stdev: float = Field(
        ge=0.0, description="Sample standard deviation of tokens/s across reps."
    )
    speedup: float = Field(
        gt=0.0, description="Median across reps of tokens/s over the baseline's in that rep."
    )
    speedup_mean: float | None = Field(
        None, gt=0.0, description="Mean across reps of the per-rep speedups; None for the baseline."
    )
    speedup_stdev: float | None = Field(
        None,
        ge=0.0,
        description="Sample standard deviation of the per-rep speedups (0 for one rep); None for the "
        "baseline. T2's sigma.",
    )
    acceptance_rate: Fraction = Field(description="Accepted / drafted tokens over all reps.")
    mean_acceptance_length: float = Field(ge=0.0, description="Tokens per verify step, bonus token included.")
    per_position_acceptance: list[Fraction] = Field(description="Acceptance rate at each draft depth.")
    ttft_s: float = Field(ge=0.0, description="Mean time to first token, seconds.")
    tpot_s: float = Field(ge=0.0, description="Mean time per output token after the first, seconds.")
    extra_memory_bytes: int = Field(ge=0, description="Peak memory on top of the target and its KV cache.")
    greedy_agreement: Fraction | None = Field(
        None,
        description="Share of the bench's prompts whose greedy output on the candidate's server equals the "
        "baseline server's (text for text; token for token where the server returns token ids, as vLLM "
        "does for the topk5 evidence): what the `exact` gate of an engine measured over HTTP (vLLM, "
        "SGLang, `specops serve engine`) decides on. None for benches measured in-process.",
    )
    top5: Top5Evidence | None = Field(
        None,
        description="What the `topk5` gate of a candidate measured on a vLLM server decides on; None "
        "otherwise.",
    )
    mmlu: MmluEvidence | None = Field(
        None,
        description="What the `mmlu_slice` gate of a candidate measured on an engine server (vLLM, "
        "SGLang) decides on; None otherwise.",
    )
    structured: StructuredEvidence | None = Field(
        None,
        description="What the `constraint_violation` gate of a candidate measured on an engine server "
        "decides on; None otherwise.",
    )
    launch_args: list[str] | None = Field(
        None,
        description="The flags its engine server was launched with after the model (benches over HTTP): "
        "the speculative flags `apply` renders for the candidate, then the server settings every method "
        "of the bench shares. None in-process, and for a server attached to by URL.",
    )


class GateOutcome(Model):
    """Result of the quality gate on one candidate."""

    method: GateMethod = Field(description="Gate method applied.")
    passed: bool | None = Field(description="Gate verdict; None only while the method is `pending`.")
    score: float | None = Field(
        None, description="The method's statistic (agreement, KL, MMLU delta, violations per 1k tokens)."
    )
    threshold: float | None = Field(
        None, description="Bound the score was compared with; None if none applies."
    )
    details: dict[str, JsonValue] = Field(
        default_factory=dict, description="Method-specific evidence, e.g. sample counts or worst prompts."
    )

    @model_validator(mode="after")
    def _pending_has_no_verdict(self) -> Self:
        if (self.method == GateMethod.PENDING) != (self.passed is None):
            raise ValueError("`passed` must be null exactly when the gate method is 'pending'")
        return self

    def replaces(self, stored: GateOutcome | None) -> bool:
        """Whether this outcome is kept over the candidate's ``stored`` one: a verdict is final
        (a redelivered or repeated `gate.evaluated` changes nothing); only a `pending`
        placeholder is replaced, and by a verdict."""
        return stored is None or (stored.passed is None and self.passed is not None)


def verdict_is_final(outcome: GateOutcome | None, method: GateMethod) -> bool:
    """Whether a measured candidate's outcome so far (None: none yet) is its last under the
    bench's gate method: a `pending` placeholder is final only when the method is `pending`
    itself; under any other the quality gate replaces it with a verdict later.

    The join of a bench's `bench.completed` with its `gate.evaluated`s, wherever it is made
    (the predictor's answer, the tuner's trial, the gate's own redelivery), waits for this.
    """
    return outcome is not None and (outcome.passed is not None or method == GateMethod.PENDING)


class CandidateResult(Model):
    """One row of a run's candidates table: prediction, measurement and gate together."""

    candidate: Candidate = Field(description="The configuration.")
    prediction: Prediction = Field(description="The predictor's expectation for it.")
    measurement: Measurement | None = Field(
        None, description="Measured summary; None if it was not measured."
    )
    gate: GateOutcome | None = Field(None, description="Quality-gate outcome; None if it was not gated.")
    quality_preserved: Fraction = Field(
        1.0, description="1.0 unless the gate failed, then 0.0 (the scorer disqualifies the row)."
    )
    error_stage: ErrorStage | None = Field(
        None, description="Why the candidate is disqualified; None if not."
    )
    error_message: str | None = Field(None, description="Human-readable cause when error_stage is set.")

    @model_validator(mode="after")
    def _gate_failure_disqualifies(self) -> Self:
        # Seed 000: a gate fail sets quality_preserved=0.0 and error_stage="quality_regression".
        failed = self.gate is not None and self.gate.passed is False
        if failed and (self.quality_preserved != 0.0 or self.error_stage != ErrorStage.QUALITY_REGRESSION):
            raise ValueError(
                "a failed gate requires quality_preserved=0.0 and error_stage='quality_regression'"
            )
        return self
