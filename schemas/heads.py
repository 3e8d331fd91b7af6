"""T3 Learn: the HTTP bodies of `heads` and the events of
`spec.head.<head_id>.*`.

Flow (every event's correlation_id is the head id):

- gateway: `POST heads/data` stores a JSONL of `{"prompt", "completion"}` lines in the
  tenant's part of the content-addressed artifact store (by sha256); `POST heads/train`
  references one (training) or two (and held-out) of them by sha256, registers the head
  as `training` and publishes `head.requested`.
- head-trainer: `head.training_started`, one `head.epoch_completed` per epoch (epoch 0
  measures the untrained head), then `head.trained` (the artifact in the store, by
  sha256) or `head.failed`. A trainer killed mid-run resumes from its checkpoint on
  redelivery and ends with the weights of an uninterrupted run.
- quality-gate: evaluates the trained head on the held-out prompts (lossless check,
  measured acceptance and speedup against `none`) -> `head.gated` (passed or not, why).
- gateway (the registry's one writer): on `head.gated` the head becomes `validated`
  (pass) or `rejected` (fail, with the reason), published as `head.transitioned`;
  people move it on with `POST heads/{id}/transition` (each move a `head.transitioned`,
  audited; `uat -> production` also writes a `speculative_head_approvals` row).
- predictor: folds `head.transitioned` into the heads it offers: a tenant's
  `production` heads for their target in its T1 runs (`uat` ones too when the run asks,
  `RunCreateRequest.include_uat_heads`); a `deprecated` head is offered no more.

Lifecycle (LIFECYCLE below): training -> validated | rejected | failed (by the services);
validated -> uat (developer or above); uat -> production (admin or head_reviewer, with a
rationale); validated | uat | production -> deprecated (developer or above, with a
rationale; non-destructive: runs that bound the head keep it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specbus.envelope import EventPayload
from specops_schemas.base import MAX_SEED, Fraction, Model, UtcDatetime
from specops_schemas.catalog import ErrorStage

HEAD_ID_PATTERN = r"^hd-[0-9a-f]{24}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
MAX_HEAD_BUDGET_MINUTES = 48 * 60.0

# What `POST heads/train` trains (speccore.training.run.HEAD_FAMILIES less `draft`);
# eagle3 is refused (422) unless ENABLE_L4_EAGLE3_TRAINING is set on the gateway.
HeadFamily = Literal["medusa", "eagle", "eagle3"]
HeadState = Literal["training", "validated", "rejected", "failed", "uat", "production", "deprecated"]
# The states a person may ask for (`POST heads/{id}/transition`).
TargetState = Literal["uat", "production", "deprecated"]
# Legal moves: from -> to. training's exits are the services'; the rest are people's.
LIFECYCLE: dict[str, frozenset[str]] = {
    "training": frozenset({"validated", "rejected", "failed"}),
    "validated": frozenset({"uat", "deprecated"}),
    "uat": frozenset({"production", "deprecated"}),
    "production": frozenset({"deprecated"}),
    "rejected": frozenset(),
    "failed": frozenset(),
    "deprecated": frozenset(),
}
# States whose heads T1 may offer: production always, uat when the run asks for it.
OFFERED_STATES = frozenset({"production", "uat"})


# --- HTTP ------------------------------------------------------------------------------------


class HeadDataResponse(Model):
    """A training or held-out JSONL the tenant uploaded (`POST heads/data`)."""

    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the uploaded bytes: its reference.")
    size_bytes: int = Field(ge=1, description="Size in bytes.")
    examples: int = Field(ge=1, description='`{"prompt", "completion"}` lines in it.')
    created_at: UtcDatetime = Field(description="When it was first uploaded.")


class HeadGateSpec(Model):
    """What the trained head must show on the held-out prompts to be registered `validated`."""

    # The rate is per drafted token: a Medusa chain drafts num_heads tokens a step and its
    # later heads are weak, so a useful head's rate is low (a 4-head smollm2 head trained on
    # the CPU measured 0.091 at 1.31x over `none`, bench/results/t3-medusa-rejected-cpu2.json);
    # an untrained one measures about 0.01.
    min_acceptance: Fraction = Field(
        0.05, description="Least draft-token acceptance rate (accepted / drafted) measured on speccore."
    )
    min_speedup: float | None = Field(
        None,
        gt=0.0,
        le=100.0,
        description="Least speedup over `none` on those prompts (at most 100); None: recorded, not required.",
    )
    n_prompts: int = Field(4, ge=1, le=64, description="Held-out prompts decoded.")
    max_new_tokens: int = Field(32, ge=8, le=512, description="Tokens generated per prompt.")
    reps: int = Field(2, ge=1, le=10, description="Interleaved reps of head and `none` for the speedup.")


class HeadTrainRequest(Model):
    """Body of `POST heads/train`."""

    target: str = Field(
        min_length=1, max_length=512, description="The target the head drafts for: alias, local dir or HF id."
    )
    family: HeadFamily = Field(
        description="`medusa`, `eagle`, or `eagle3` (behind ENABLE_L4_EAGLE3_TRAINING)."
    )
    train_data: str = Field(
        pattern=SHA256_PATTERN, description="sha256 of a `POST heads/data` upload: training set."
    )
    heldout_data: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="sha256 of the held-out upload; None: 5 % of the training set by prompt hash.",
    )
    name: str | None = Field(None, max_length=200, description="A name for the head.")
    epochs: int = Field(2, ge=1, le=100, description="Passes over the training set.")
    budget_minutes: float | None = Field(
        None,
        gt=0.0,
        le=MAX_HEAD_BUDGET_MINUTES,
        description="Training-time budget; the head trained so far is gated when it runs out.",
    )
    lr: float | None = Field(None, gt=0.0, le=1.0, description="Peak learning rate; None: the family's.")
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seed of the initial weights, the batch order and the noise (32 bits).",
    )
    num_heads: int = Field(4, ge=1, le=8, description="Medusa heads (draft depth).")
    draft_vocab: int = Field(8192, ge=256, le=262_144, description="Tokens the head scores.")
    max_len: int = Field(512, ge=32, le=8192, description="Tokens per training sequence.")
    gate: HeadGateSpec = Field(default_factory=HeadGateSpec, description="The gate before the registry.")


class HeadTransitionRequest(Model):
    """Body of `POST heads/{id}/transition`."""

    to: TargetState = Field(description="`uat`, `production` or `deprecated`.")
    rationale: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="One line: why. Required for `production` (written to speculative_head_approvals) "
        "and `deprecated`.",
    )


class HeadEpoch(Model):
    """One point of the training curve (epoch 0: the untrained head)."""

    epoch: int = Field(ge=0, description="1-based epoch; 0 measures the head before training.")
    steps: int = Field(ge=0, description="Optimizer steps so far.")
    tokens_seen: int = Field(ge=0, description="Training tokens so far.")
    train_loss: float | None = Field(description="Mean loss over the epoch; None for epoch 0.")
    heldout: dict[str, float] = Field(
        description="Held-out measurements, e.g. `chain_mean_acceptance_length` (1 + heads right in a row)."
    )
    elapsed_s: float = Field(ge=0.0, description="Training seconds so far.")


class SpeculatorsExport(Model):
    """An EAGLE-3 head written in the speculators layout, the one vLLM loads (its
    ``--speculative-config`` ``{"method": "eagle3", "model": <path>}``); SGLang does not."""

    path: str = Field(
        min_length=1,
        max_length=512,
        description="Its directory relative to the store: `heads/<tenant>/<sha256>/speculators`.",
    )
    verifier: str = Field(
        min_length=1, max_length=512, description="The target's Hugging Face id, as the export names it."
    )
    speculative_tokens: int = Field(
        ge=1, description="The k the export proposes by default (a run's candidate sets its own)."
    )
    speculators_version: str = Field(min_length=1, description="The speculators schema it follows.")


class HeadArtifact(Model):
    """A trained head in the artifact store."""

    sha256: str = Field(pattern=SHA256_PATTERN, description="Digest of the artifact (config.json + weights).")
    path: str = Field(
        min_length=1,
        max_length=512,
        description="Its directory relative to the store: `heads/<tenant>/<sha256>`.",
    )
    weights_sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of head.safetensors alone.")
    target_weights: str = Field(
        min_length=1, description="Fingerprint of the target's weights it was trained on."
    )
    num_heads: int = Field(ge=1, description="Medusa heads, or the EAGLE draft depth.")
    eagle_version: int | None = Field(
        None, description="2 (EAGLE-1 layer) or 3 for eagle heads; None for medusa."
    )
    params: int = Field(ge=1, description="Trainable parameters.")
    speculators: SpeculatorsExport | None = Field(
        None,
        description="The head exported for vLLM, written with it by the head-trainer (EAGLE-3 heads of a "
        "target with a Hugging Face id); None for the others.",
    )


class HeadGateResult(Model):
    """What the quality gate measured on the held-out prompts."""

    passed: bool = Field(description="Lossless, and the thresholds of the request's `gate` hold.")
    reason: str = Field(min_length=1, description="Why, with the numbers, for a person.")
    lossless: bool = Field(
        description="Greedy output with the head equals the target's own, token for token."
    )
    acceptance_rate: Fraction = Field(description="Accepted / drafted tokens.")
    mean_acceptance_length: float = Field(ge=0.0, description="Tokens per verify step, bonus included.")
    speedup: float = Field(ge=0.0, description="Median speedup over `none` (tokens/s ratio).")
    tokens_per_s: float = Field(ge=0.0, description="With the head.")
    baseline_tokens_per_s: float = Field(ge=0.0, description="`none` on the same prompts.")
    n_prompts: int = Field(ge=1, description="Held-out prompts decoded.")
    max_new_tokens: int = Field(ge=1, description="Tokens per prompt.")
    hardware: str = Field(min_length=1, description="Where it was measured.")


class HeadTransition(Model):
    """One move of the lifecycle."""

    from_state: HeadState = Field(description="State before.")
    to_state: HeadState = Field(description="State after.")
    actor: str = Field(
        min_length=1, max_length=128, description="API token id, or the service that moved it."
    )
    role: str = Field(min_length=1, max_length=32, description="The actor's role, or `service`.")
    rationale: str | None = Field(None, max_length=500, description="Why (people's moves).")
    at: UtcDatetime = Field(description="When.")


class HeadResponse(Model):
    """Body of `GET heads/{id}` (and of `POST heads/train`, 202)."""

    id: str = Field(pattern=HEAD_ID_PATTERN, description="Head id: the `draft` of its T1 candidates.")
    name: str | None = Field(None, description="The tenant's name for it.")
    state: HeadState = Field(description="Lifecycle state.")
    target: str = Field(description="The target it drafts for.")
    family: HeadFamily = Field(description="Head family.")
    created_at: UtcDatetime = Field(description="When it was requested.")
    updated_at: UtcDatetime = Field(description="Last change.")
    request: HeadTrainRequest = Field(description="The training request as accepted.")
    epochs: list[HeadEpoch] = Field(default_factory=list, description="The training curve so far.")
    artifact: HeadArtifact | None = Field(None, description="Once trained.")
    gate: HeadGateResult | None = Field(None, description="Once gated.")
    transitions: list[HeadTransition] = Field(default_factory=list, description="Every move, oldest first.")
    error: str | None = Field(None, description="Why training or gating failed (state `failed`).")


class HeadList(Model):
    """The tenant's heads (`GET heads`), newest first."""

    heads: list[HeadResponse] = Field(description="Heads, newest first.")


# --- events ----------------------------------------------------------------------------------


class HeadEvent(EventPayload):
    """Base of the events on `spec.head.<head_id>.*`."""

    head_id: str = Field(pattern=HEAD_ID_PATTERN, description="The head; the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.head_id


class HeadRequested(HeadEvent):
    """A client asked for a head (published by the gateway)."""

    event_type = "head.requested"
    request: HeadTrainRequest = Field(description="The validated request.")
    train_path: str = Field(min_length=1, description="Training JSONL relative to the artifact store.")
    heldout_path: str | None = Field(None, description="Held-out JSONL relative to the store; None: split.")
    requested_by: str = Field(min_length=1, max_length=128, description="Id of the API token that asked.")


class HeadTrainingStarted(HeadEvent):
    """The trainer has the data and the target and trains (again, after a restart)."""

    event_type = "head.training_started"
    resumed_from_step: int | None = Field(description="The checkpoint's step it resumed from; None: fresh.")
    hardware: str = Field(min_length=1, description="Where it trains.")


class HeadEpochCompleted(HeadEvent):
    """One epoch ended (epoch 0: the untrained head measured)."""

    event_type = "head.epoch_completed"
    epoch: HeadEpoch = Field(description="The curve's new point.")


class HeadTrained(HeadEvent):
    """Training ended; the head is in the store, to be gated (published by the head-trainer)."""

    event_type = "head.trained"
    request: HeadTrainRequest = Field(description="The training request (the gate's thresholds).")
    heldout_path: str | None = Field(description="Held-out JSONL relative to the store; None: the split.")
    train_path: str = Field(min_length=1, description="Training JSONL relative to the store.")
    artifact: HeadArtifact = Field(description="The trained head.")
    stopped_by: Literal["epochs", "budget"] = Field(description="What ended training.")
    steps: int = Field(ge=0, description="Optimizer steps.")
    tokens_seen: int = Field(ge=0, description="Training tokens seen.")
    train_seconds: float = Field(ge=0.0, description="Training time.")


class HeadGated(HeadEvent):
    """The quality gate's verdict on a trained head."""

    event_type = "head.gated"
    artifact: HeadArtifact = Field(description="The head gated.")
    result: HeadGateResult = Field(description="What it measured and decided.")


class HeadTransitioned(HeadEvent):
    """The head moved in its lifecycle (published by the gateway, the registry's writer).

    Carries what the predictor needs to offer it, so no one reads the registry's tables."""

    event_type = "head.transitioned"
    tenant_target: str = Field(min_length=1, description="The head's target (model_ref it was trained for).")
    family: HeadFamily = Field(description="Head family.")
    transition: HeadTransition = Field(description="The move.")
    artifact: HeadArtifact | None = Field(
        None, description="The artifact; None for a head that never trained."
    )
    acceptance_rate: Fraction | None = Field(None, description="The gate's measured acceptance rate.")
    mean_acceptance_length: float | None = Field(None, description="The gate's tokens per verify step.")


class HeadFailed(HeadEvent):
    """Training or gating could not finish (bad data, target not loadable, ...)."""

    event_type = "head.failed"
    error_stage: ErrorStage = Field(description="Stage that failed.")
    message: str = Field(min_length=1, description="Human-readable cause, safe to show the client.")


HEAD_EVENT_TYPES: tuple[type[HeadEvent], ...] = (
    HeadRequested,
    HeadTrainingStarted,
    HeadEpochCompleted,
    HeadTrained,
    HeadGated,
    HeadTransitioned,
    HeadFailed,
)
