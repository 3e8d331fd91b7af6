"""The head-trainer's decisions and events for a `head.requested`, built without I/O.

Per head: `head.training_started` each time training (re)starts, one
`head.epoch_completed` per epoch (epoch 0: the untrained head), then `head.trained` or
`head.failed`. The epoch, trained and failed events have ids derived from the head
(uuid5 of `<head_id>/<what>`), so an epoch a resumed run reports again, or a
`head.trained` re-queued for a redelivered request, is a no-op in the outbox, dropped by
the broker's dedup and by the consumers' inboxes. Each start is its own fact: a fresh id.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from specbus.envelope import Envelope, EventPayload
from speccore.models import hub_id
from speccore.training.run import HeadPlan
from speccore.training.trainer import EpochReport
from specops_schemas.catalog import ErrorStage
from specops_schemas.heads import (
    HeadArtifact,
    HeadEpoch,
    HeadEpochCompleted,
    HeadFailed,
    HeadRequested,
    HeadTrained,
    HeadTrainingStarted,
    SpeculatorsExport,
)

PRODUCER = "head-trainer"
# What this service publishes (its NATS user may publish these subjects only).
PUBLISHES = (HeadTrainingStarted, HeadEpochCompleted, HeadTrained, HeadFailed)
# uuid5 namespace of the event ids this service derives (any fixed UUID would do).
EVENT_NAMESPACE = uuid.UUID("5b0e2f6c-8d1a-4e37-a9c4-7f2d61e03b58")
# EAGLE generation of each family's artifact (HeadArtifact.eagle_version).
EAGLE_VERSIONS: dict[str, int | None] = {"medusa": None, "eagle": 2, "eagle3": 3}
# Artifact families written beside the head in another engine's layout as part of training:
# EAGLE-3 heads as speculators checkpoints, the layout vLLM loads (speccore.heads.speculators).
# Medusa and EAGLE-1 heads have none: vLLM's loaders for those read other projects' layouts.
SPECULATORS_FAMILIES = frozenset({"eagle3"})
# The k an export proposes when a launch line gives none; a T1 candidate sets its own.
SPECULATORS_K = 3
# The longest message a head.failed carries.
MAX_MESSAGE = 2000

P = TypeVar("P", bound=EventPayload)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a head cannot be trained; not retried (the same request would fail the same way)."""

    error_stage: ErrorStage
    message: str


def head_plan(event: Envelope[HeadRequested], *, checkpoint_every: int, batch_tokens: int) -> HeadPlan:
    """The training plan of a request; SpecError if it cannot be trained (family, flag).

    The host's knobs (checkpoint interval, batch size) are part of the plan, hence of the
    checkpoint's run key: change them and a half-trained head starts over.
    """
    request = event.payload.request
    return HeadPlan(
        family=request.family,
        epochs=request.epochs,
        lr=request.lr,
        seed=request.seed,
        budget_minutes=request.budget_minutes,
        max_len=request.max_len,
        batch_tokens=batch_tokens,
        draft_vocab=request.draft_vocab,
        num_heads=request.num_heads,
        checkpoint_every=checkpoint_every,
        extra={"head_id": event.payload.head_id},
    )


def training_started(
    event: Envelope[HeadRequested], resumed_from_step: int | None, hardware: str
) -> Envelope[HeadTrainingStarted]:
    started = HeadTrainingStarted(
        head_id=event.payload.head_id, resumed_from_step=resumed_from_step, hardware=hardware
    )
    return event.follow(started, producer=PRODUCER)


def epoch(report: EpochReport) -> HeadEpoch:
    return HeadEpoch(
        epoch=report.epoch,
        steps=report.steps,
        tokens_seen=report.tokens_seen,
        train_loss=report.train_loss,
        heldout=dict(report.heldout),
        elapsed_s=max(report.elapsed_s, 0.0),
    )


def epoch_completed(event: Envelope[HeadRequested], report: EpochReport) -> Envelope[HeadEpochCompleted]:
    done = HeadEpochCompleted(head_id=event.payload.head_id, epoch=epoch(report))
    return _derived(event, done, f"epoch/{report.epoch}")


def speculators_verifier(family: str, target: str) -> str | None:
    """The Hugging Face id an export of a `family` head for `target` names as its verifier;
    None when no export is written (another family, or a target with no hub id: a local
    directory only this host reads)."""
    return hub_id(target) if family in SPECULATORS_FAMILIES else None


def speculators_export(path: str, config: Mapping[str, Any]) -> SpeculatorsExport:
    """The registry's record of an export, from its store path and its config.json."""
    spec = config["speculators_config"]
    return SpeculatorsExport(
        path=path,
        verifier=str(spec["verifier"]["name_or_path"]),
        speculative_tokens=int(spec["proposal_methods"][0]["speculative_tokens"]),
        speculators_version=str(config["speculators_version"]),
    )


def head_artifact(
    *,
    digest: str,
    path: str,
    weights_sha256: str,
    config: Mapping[str, Any],
    params: int,
    speculators: SpeculatorsExport | None = None,
) -> HeadArtifact:
    """The artifact of a trained head from its digest, store path, weights' sha256 and config.json
    (and its speculators export, if one was written)."""
    provenance = config.get("provenance") or {}
    return HeadArtifact(
        sha256=digest,
        path=path,
        weights_sha256=weights_sha256,
        target_weights=str(provenance["target_weights"]),
        num_heads=int(config["num_heads"]),
        eagle_version=EAGLE_VERSIONS.get(str(config["family"])),
        params=params,
        speculators=speculators,
    )


def trained(
    event: Envelope[HeadRequested], artifact: HeadArtifact, config: Mapping[str, Any]
) -> Envelope[HeadTrained]:
    """`head.trained`, everything but the request read from the artifact: a redelivered request
    whose head is in the store already re-queues the same event (same id, same body)."""
    provenance = config.get("provenance") or {}
    requested = event.payload
    done = HeadTrained(
        head_id=requested.head_id,
        request=requested.request,
        heldout_path=requested.heldout_path,
        train_path=requested.train_path,
        artifact=artifact,
        stopped_by="budget" if provenance.get("stopped_by") == "budget" else "epochs",
        steps=int(provenance.get("steps", 0)),
        tokens_seen=int(provenance.get("tokens_seen", 0)),
        train_seconds=max(float(provenance.get("train_seconds", 0.0)), 0.0),
    )
    return _derived(event, done, "trained")


def failed(event: Envelope[HeadRequested], failure: Failure) -> Envelope[HeadFailed]:
    message = failure.message.strip() or failure.error_stage.value
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    stop = HeadFailed(head_id=event.payload.head_id, error_stage=failure.error_stage, message=message)
    return _derived(event, stop, "failed")


def event_id(head_id: str, key: str) -> str:
    """The id of a head's derived event `key` (`epoch/<n>`, `trained`, `failed`)."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{head_id}/{key}"))


def _derived(event: Envelope[HeadRequested], payload: P, key: str) -> Envelope[P]:
    follow = event.follow(payload, producer=PRODUCER)
    return follow.model_copy(update={"event_id": event_id(event.payload.head_id, key)})
