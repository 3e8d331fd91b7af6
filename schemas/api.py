"""HTTP bodies of the T1 endpoints under API_PREFIX."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specops_schemas.base import Fraction, Id, Model, UtcDatetime
from specops_schemas.candidates import Candidate, CandidateResult, Measurement
from specops_schemas.catalog import Engine, ErrorStage, Family, Fingerprint, GateMethod, Mode, Role, RunStatus

API_PREFIX = "/api/v1/inferenceiq/speculative"
PROBLEM_MEDIA_TYPE = "application/problem+json"
# Weights are normalised, so only their ratio matters; the bound keeps 1e30 and inf out.
MAX_PRIORITY_WEIGHT = 1000.0


class Target(Model):
    """The deployment to speed up; its weights are never changed."""

    model_ref: str = Field(
        min_length=1,
        max_length=512,
        description="Hugging Face id, local path or specops alias of the target.",
    )
    gpu: str = Field(min_length=1, max_length=64, description="Hardware profile, e.g. `H100-80GB` or `cpu`.")
    engine: Engine = Field(description="Serving engine the winner is applied to.")
    engine_version: str | None = Field(
        None, max_length=64, description="Engine version; None means the version installed here."
    )
    gpu_count: int | None = Field(
        None,
        ge=1,
        le=16,
        description="Devices the deployment has (its tensor-parallel degree, which L4 never changes): "
        "the run is planned on exactly these or refused with the options when they cannot hold the "
        "target. None: the fewest that hold it, stated in the run's `fit`.",
    )

    @model_validator(mode="after")
    def _power_of_two(self) -> Self:
        if self.gpu_count is not None and self.gpu_count & (self.gpu_count - 1):
            raise ValueError(
                f"gpu_count must be 1, 2, 4, 8 or 16 (a tensor-parallel degree), not {self.gpu_count}"
            )
        return self


class InferredFingerprint(Model):
    """How the gateway inferred a run's fingerprint when the request asked for `auto`."""

    source: Literal["samples", "live"] = Field(
        "samples",
        description="`samples`: the request's own; `live`: the tenant's latest live summary from the "
        "engine server serving the target (ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT).",
    )
    samples: int = Field(
        ge=1, description="Sample requests the fingerprint was inferred from (live: the window's requests)."
    )
    confidence: Fraction = Field(description="The fingerprint's mean probability over the samples.")
    runner_up: Fingerprint = Field(description="The fingerprint with the next highest mean probability.")
    runner_up_confidence: Fraction = Field(description="The runner-up's mean probability.")
    window_s: float | None = Field(
        None, ge=0.0, description="Live: seconds from the window's first request to its last."
    )
    summarized_at: UtcDatetime | None = Field(None, description="Live: when the engine server summarized it.")


class Workload(Model):
    """What the endpoint serves; drives catalog pruning and the measurement prompts."""

    fingerprint: Fingerprint = Field(description="One of the 8 workload fingerprints.")
    inferred: InferredFingerprint | None = Field(
        None, description="Set by the gateway when the request asked for `auto`: how it was inferred."
    )


MAX_SAMPLES = 64
MAX_SAMPLE_CHARS = 200_000
MAX_SAMPLE_MESSAGES = 256


class ChatMessage(Model):
    """One message of a sample request in the OpenAI chat format."""

    role: str = Field(min_length=1, max_length=32, description="`system`, `user`, `assistant`, `tool`...")
    content: str = Field(max_length=MAX_SAMPLE_CHARS, description="The message's text.")


Sample = (
    Annotated[str, Field(min_length=1, max_length=MAX_SAMPLE_CHARS)]
    | Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_SAMPLE_MESSAGES)]
)


class WorkloadRequest(Model):
    """The workload as a request states it: a fingerprint, or `auto` with sample requests the
    gateway infers it from (their text is read at intake and never stored)."""

    fingerprint: Fingerprint | Literal["auto"] = Field(
        description="One of the 8 workload fingerprints, or `auto` to infer it from `samples` (without "
        "them: from the tenant's live traffic, where the gateway has ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT)."
    )
    samples: list[Sample] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SAMPLES,
        description=f"With `auto`: 1-{MAX_SAMPLES} sample requests, each a prompt string or a list "
        f"of chat messages (at most {MAX_SAMPLE_CHARS} characters a text).",
    )

    @model_validator(mode="after")
    def _samples_with_auto(self) -> Self:
        if self.fingerprint != "auto" and self.samples:
            raise ValueError('samples are read only with fingerprint "auto"')
        return self


class Priorities(Model):
    """Relative weights of the scoring objectives (the scorer normalises them to sum 1)."""

    throughput: float = Field(
        0.0, ge=0.0, le=MAX_PRIORITY_WEIGHT, description="Weight of decode tokens/s (at most 1000)."
    )
    latency: float = Field(
        0.0, ge=0.0, le=MAX_PRIORITY_WEIGHT, description="Weight of time per output token (at most 1000)."
    )

    @model_validator(mode="after")
    def _some_weight(self) -> Self:
        if self.throughput + self.latency <= 0.0:
            raise ValueError("at least one priority weight must be positive")
        return self

    def weights(self) -> tuple[float, float]:
        """(throughput, latency) weights summing to 1."""
        total = self.throughput + self.latency
        return self.throughput / total, self.latency / total

    def score(self, throughput_speedup: float, latency_speedup: float) -> float:
        """The priority-weighted mean of a throughput and a latency speedup (higher is better)."""
        w_thr, w_lat = self.weights()
        return w_thr * throughput_speedup + w_lat * latency_speedup

    def measured_score(self, m: Measurement, baseline: Measurement | None) -> float:
        """A measured candidate's score: throughput = its measured tokens/s ratio (`speedup`);
        latency = baseline TPOT / candidate TPOT (the speedup again without a usable baseline).
        The T1 winner's and a T2 trial's objective."""
        latency = m.speedup
        if baseline is not None and baseline.tpot_s > 0 and m.tpot_s > 0:
            latency = baseline.tpot_s / m.tpot_s
        return self.score(m.speedup, latency)


class Goal(Model):
    """What a winner must preserve and optimise."""

    quality_gate: GateMethod = Field(GateMethod.TOPK5, description="Quality-gate method; `topk5` by default.")
    priorities: Priorities = Field(
        default_factory=lambda: Priorities(throughput=0.7, latency=0.3),
        description="Scoring weights; throughput 0.7 / latency 0.3 when omitted.",
    )


class RunSettings(Model):
    """What a run request states besides its workload."""

    target: Target = Field(description="Target model, GPU and engine.")
    mode: Mode = Field(Mode.INTERACTIVE, description="Serving pressure to optimise for.")
    goal: Goal = Field(default_factory=Goal, description="Quality gate and priorities.")
    include_uat_heads: bool = Field(
        False,
        description="Also offer the tenant's T3 heads in `uat` (production ones always are); such a run "
        "neither reads nor fills the winner cache.",
    )

    @model_validator(mode="after")
    def _gate_runs_on_the_engine(self) -> Self:
        """An engine server returns a token's 20 most likely log-probabilities at most, which
        every other gate method does with; logit_kl needs the whole distribution."""
        engine = self.target.engine
        if self.goal.quality_gate == GateMethod.LOGIT_KL and engine in (Engine.VLLM, Engine.SGLANG):
            raise ValueError(
                f"goal.quality_gate logit_kl needs each emitted token's whole distribution, which a "
                f"{engine} server does not return; choose topk5 (the default), exact, mmlu_slice or "
                "constraint_violation"
            )
        return self


class RunCreateRequest(RunSettings):
    """A run's request as the gateway accepted it: `POST runs`'s body with its workload resolved."""

    workload: Workload = Field(description="Workload fingerprint.")


class RunCreateBody(RunSettings):
    """Body of `POST runs`."""

    workload: WorkloadRequest = Field(description="Workload fingerprint, or `auto` with samples.")

    def accepted(self, workload: Workload) -> RunCreateRequest:
        """The request with its workload resolved."""
        fields = self.model_dump(exclude={"workload"})
        return RunCreateRequest.model_validate({**fields, "workload": workload})


class FitRow(Model):
    """Memory per device of one deployment of the target (GiB, 2^30 bytes)."""

    gpus: int = Field(ge=1, description="Devices the target is sharded over (tensor parallel).")
    weight_dtype: str = Field(description="Dtype of the target's weights: `bf16`, `fp8` or `fp32`.")
    weights_gib: float = Field(ge=0, description="The target's weights on each device.")
    kv_cache_gib: float = Field(
        ge=0, description="Its KV cache for the workload's context and batch, per device."
    )
    draft_gib: float = Field(
        ge=0, description="The largest known draft model and its KV cache, whole on one device."
    )
    usable_gib: float = Field(
        ge=0, description="Usable memory of each device (90% of it, as vLLM's default)."
    )
    fits: bool = Field(description="Weights and KV cache fit.")
    fits_with_draft: bool = Field(description="They fit beside the largest draft too.")


class FitReport(Model):
    """Whether the target fits the requested devices, and what the plan assumed (L0 feasibility)."""

    gpu: str = Field(description="Hardware profile.")
    requested_gpus: int = Field(ge=1, description="`target.gpu_count`, or 1 when the request names none.")
    gpus_stated: bool = Field(description="Whether the request named its gpu_count.")
    planned_gpus: int = Field(ge=1, description="Devices the predictions are for.")
    weight_dtype: str = Field(description="Dtype of the target's weights the predictions assume.")
    context_tokens: int = Field(ge=1, description="Working context per sequence the KV cache holds.")
    batch: int = Field(ge=1, description="Concurrent sequences the KV cache holds (the latency batch).")
    largest_draft: str | None = Field(
        None, description="The largest known draft model counted in `draft_gib`."
    )
    fits_as_requested: bool = Field(description="The requested devices hold the target in its dtype.")
    rows: list[FitRow] = Field(description="One row per device count, then the FP8-weight rows if any.")
    options: list[str] = Field(
        default_factory=list, description="What would hold the target when the requested devices do not."
    )
    summary: str = Field(description="The check in one paragraph: need, fit, assumption, options.")


class RunError(Model):
    """Why a run failed."""

    error_stage: ErrorStage = Field(description="Stage that failed.")
    message: str = Field(description="Human-readable cause.")


class RunStatusResponse(Model):
    """Body of `GET runs/{id}`, and of `POST runs` (202, or 200 on a cache hit)."""

    id: Id = Field(description="Run id.")
    status: RunStatus = Field(description="Lifecycle stage.")
    created_at: UtcDatetime = Field(description="When the run was accepted.")
    updated_at: UtcDatetime = Field(description="Last status change.")
    request: RunCreateRequest = Field(description="The request as accepted, defaults filled in.")
    cache_hit: bool = Field(False, description="True when answered from the 30-day winner cache.")
    measured: bool | None = Field(
        None,
        description="Whether the winner was measured here (False: predicted only); None until completed.",
    )
    winner: CandidateResult | None = Field(None, description="The chosen configuration once completed.")
    candidates: list[CandidateResult] = Field(default_factory=list, description="The candidates table.")
    pareto_front: list[str] = Field(default_factory=list, description="candidate_ids on the pareto front.")
    error: RunError | None = Field(None, description="Set when status is `failed`.")
    speculation_disabled: str | None = Field(
        None,
        description="Set (the reason) when the run completed without speculation because the tenant's "
        "security policy opts out (F-S3): nothing was measured and no candidate is offered.",
    )
    fit: FitReport | None = Field(
        None,
        description="The target's memory fit on the requested GPUs and what the predictions assume; set "
        "from `run.predicted` (a cache-hit answer has none).",
    )


class RunSummary(Model):
    """One row of `GET runs`: what a list of runs shows without each run's candidates."""

    id: Id = Field(description="Run id.")
    status: RunStatus = Field(description="Lifecycle stage.")
    created_at: UtcDatetime = Field(description="When the run was accepted.")
    target: Target = Field(description="Target model, GPU and engine.")
    fingerprint: Fingerprint = Field(description="Workload fingerprint.")
    winner_family: Family | None = Field(None, description="The winner's family once completed.")
    measured_speedup: float | None = Field(
        None, description="The winner's measured speedup; None until completed or when predicted only."
    )
    cache_hit: bool = Field(False, description="True when answered from the 30-day winner cache.")
    speculation_disabled: str | None = Field(
        None, description="Set (the reason) when the tenant's security policy opts out of speculation."
    )


class RunList(Model):
    """Body of `GET runs`: the tenant's runs, newest first, one page."""

    runs: list[RunSummary] = Field(description="Runs, newest first.")
    next_before: Id | None = Field(
        None, description="Pass as `before` for the next (older) page; None on the last page."
    )


class Me(Model):
    """Body of `GET me`: who the caller is."""

    token_id: str = Field(description="Id of the API token the request was authenticated with.")
    tenant_id: Id = Field(description="The token's tenant: everything the caller sees is this tenant's.")
    role: Role = Field(description="The token's role.")


class ApplyRequest(Model):
    """Body of `POST runs/{id}/apply` (may be empty)."""

    engine: Engine | None = Field(None, description="Engine to emit flags for; None means the run's engine.")
    candidate_id: str | None = Field(None, description="Candidate to apply; None means the winner.")


class VllmConfig(Model):
    """vLLM's `--speculative-config` JSON."""

    engine: Literal["vllm"] = Field(description="Discriminator.")
    method: str = Field(description="vLLM method name, e.g. `ngram`, `eagle`, `eagle3`, `medusa`, `mtp`.")
    model: str | None = Field(None, description="Draft model or head path; None for ngram and mtp.")
    num_speculative_tokens: int = Field(ge=1, description="Tokens drafted per step.")
    prompt_lookup_max: int | None = Field(None, ge=1, description="Longest n-gram matched (ngram only).")
    prompt_lookup_min: int | None = Field(None, ge=1, description="Shortest n-gram matched (ngram only).")
    draft_tensor_parallel_size: int | None = Field(None, ge=1, description="TP degree of the draft model.")
    suffix_decoding_max_tree_depth: int | None = Field(
        None, ge=1, description="suffix only: deepest pattern plus draft its suffix trees hold."
    )
    suffix_decoding_max_cached_requests: int | None = Field(
        None, ge=0, description="suffix only: earlier outputs its global tree keeps (0: no global tree)."
    )
    suffix_decoding_max_spec_factor: float | None = Field(
        None, ge=0, description="suffix only: draft at most this many tokens per matched token."
    )
    suffix_decoding_min_token_prob: float | None = Field(
        None, ge=0, le=1, description="suffix only: smallest estimated probability of a draft token."
    )


class SglangConfig(Model):
    """SGLang `--speculative-*` server arguments."""

    engine: Literal["sglang"] = Field(description="Discriminator.")
    speculative_algorithm: str = Field(description="e.g. `EAGLE`, `EAGLE3`, `NEXTN`, `STANDALONE`, `NGRAM`.")
    speculative_draft_model_path: str | None = Field(None, description="Draft model or head path.")
    speculative_num_steps: int = Field(ge=1, description="Draft depth.")
    speculative_eagle_topk: int | None = Field(
        None, ge=1, description="Branching per step of the draft tree."
    )
    speculative_num_draft_tokens: int | None = Field(None, ge=1, description="Tree nodes verified per step.")
    speculative_ngram_min_bfs_breadth: int | None = Field(
        None, ge=1, description="NGRAM only: fewest branches per level of the trie's draft (1 for a chain)."
    )
    speculative_ngram_max_bfs_breadth: int | None = Field(
        None,
        ge=1,
        description="NGRAM only: most branches per level; SGLang's eagle top-k follows it (1: a chain).",
    )


class SpeccoreConfig(Model):
    """speccore's own configuration: the candidate itself."""

    engine: Literal["speccore"] = Field(description="Discriminator.")
    candidate: Candidate = Field(description="Family, draft, k, tree and options to run.")


EngineConfig = Annotated[VllmConfig | SglangConfig | SpeccoreConfig, Field(discriminator="engine")]


class ApplyResponse(Model):
    """Body returned by `POST runs/{id}/apply`."""

    run_id: Id = Field(description="Run applied.")
    candidate_id: str = Field(description="Candidate the flags encode.")
    family: Family = Field(description="Its family.")
    config: EngineConfig = Field(description="Structured engine configuration.")
    cli_args: list[str] = Field(description="The same configuration as launch arguments for the engine.")
    requires: list[str] = Field(
        default_factory=list,
        description="Python packages the engine needs beside itself for this candidate, e.g. "
        "`arctic-inference` for vLLM's suffix method; install them into the engine's environment.",
    )


class ProblemFieldError(Model):
    """One invalid input, as in RFC 9457's example `errors` extension."""

    pointer: str = Field(description="JSON Pointer (RFC 6901, as a URI fragment) to the invalid member.")
    detail: str = Field(description="What is wrong with it.")


class Problem(BaseModel):
    """RFC 9457 problem details, served as `application/problem+json`."""

    # RFC 9457 §3.2: problem types may add extension members.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    type: str = Field("about:blank", description="URI reference identifying the problem type.")
    title: str = Field(description="Short summary of the problem type.")
    status: int = Field(ge=400, le=599, description="HTTP status code.")
    detail: str | None = Field(None, description="Explanation specific to this occurrence.")
    instance: str | None = Field(None, description="URI reference of this occurrence.")
    errors: list[ProblemFieldError] | None = Field(
        None, description="Invalid inputs, for validation problems."
    )

    @classmethod
    def validation(cls, errors: Iterable[Mapping[str, Any]], *, instance: str | None = None) -> Problem:
        """422 from pydantic/FastAPI error dicts (their `loc` and `msg`)."""
        # One entry a place: a value no member of a union takes gets one error per member.
        details: dict[str, list[str]] = {}
        for e in errors:
            pointer = "#" + "".join(f"/{_escape(part)}" for part in _body_loc(e["loc"]))
            details.setdefault(pointer, []).append(e["msg"])
        fields = [ProblemFieldError(pointer=p, detail="; or ".join(msgs)) for p, msgs in details.items()]
        return cls(
            title="Request body is invalid",
            status=422,
            detail="; ".join(f"{f.pointer[2:] or '(body)'}: {f.detail}" for f in fields),
            instance=instance,
            errors=fields,
        )


# How pydantic names the member of a union an error is about ("str-enum[Fingerprint]",
# "literal['auto']"): a step of its validation, not a place in the body.
_UNION_MEMBER = re.compile(r"[\w-]+\[.*\]")


def _body_loc(loc: Sequence[object]) -> Sequence[object]:
    # FastAPI prefixes body errors with "body"; the pointer addresses the body itself.
    body = loc[1:] if loc[:1] == ("body",) else loc
    return [part for part in body if not (isinstance(part, str) and _UNION_MEMBER.fullmatch(part))]


def _escape(part: object) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")
