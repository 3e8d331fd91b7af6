"""The gateway's decisions about T3 heads, without I/O: who may move a head where, and what each
head.* event does to the head the registry shows.

A *head* here is the HeadResponse the gateway keeps in `heads.head` and answers GET with.
Its state moves only by a `head.transitioned` (:func:`fold`): the gateway publishes one for
each move a person asks for (:func:`transition_refusal` decides whether they may) and one
for each service verdict (:func:`service_transition`: `head.gated` -> validated or
rejected, `head.failed` -> failed), so a rebuild from the stream replays the same moves.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specbus.dlq import DeadLetter
from specbus.envelope import Envelope
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import ErrorStage, Role
from specops_schemas.events import parse_event
from specops_schemas.heads import (
    HEAD_EVENT_TYPES,
    LIFECYCLE,
    HeadEpochCompleted,
    HeadEvent,
    HeadFailed,
    HeadGated,
    HeadRequested,
    HeadResponse,
    HeadState,
    HeadTrained,
    HeadTrainRequest,
    HeadTransition,
    HeadTransitioned,
)
from specops_services.gateway.http.credentials import ROLE_RANK

# What the heads projector consumes: every head event but the gateway's own.
PROJECTED = tuple(t for t in HEAD_EVENT_TYPES if t not in (HeadRequested, HeadTransitioned))
# States no event moves a head out of: its event stream ends there.
FINAL_STATES: frozenset[str] = frozenset(s for s, exits in LIFECYCLE.items() if not exits)
EAGLE3_FLAG = "ENABLE_L4_EAGLE3_TRAINING"  # speccore.training.run.EAGLE3_FLAG, without importing torch
SERVICE_ROLE = "service"
GATE_ACTOR = "quality-gate"
# Moves that need a rationale, and the roles that may make each (ROLE_RANK: head_reviewer
# counts as developer; production is signed off by an admin or a head_reviewer only).
RATIONALE_REQUIRED = frozenset({"production", "deprecated"})
_PRODUCTION_ROLES = frozenset({Role.ADMIN, Role.HEAD_REVIEWER})
# uuid5 namespace of the head.transitioned a service verdict leads to (derived from its event).
_TRANSITION_NAMESPACE = uuid.UUID("5b8f7d0e-1c2a-4e63-9f1d-3a7c2b6e8d41")
# uuid5 namespace of the head.failed a parked head event leads to (derived from the head).
_DEAD_LETTER_NAMESPACE = uuid.UUID("0f3b6f0a-6a43-4c1e-8f38-2b9d7c51a6e2")
DEAD_LETTER_ERROR_CHARS = 300


def head_location(head_id: str) -> str:
    return f"{API_PREFIX}/heads/{head_id}"


def eagle3_enabled(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(EAGLE3_FLAG, "").lower() in ("1", "true", "yes", "on")


def train_refusal(request: HeadTrainRequest, *, eagle3: bool) -> str | None:
    """Why `POST heads/train` refuses the request (422), or None."""
    if request.family == "eagle3" and not eagle3:
        return f"EAGLE-3 training is behind a feature flag: the gateway needs {EAGLE3_FLAG}=1"
    if request.heldout_data is not None and request.heldout_data == request.train_data:
        return "heldout_data must differ from train_data (the gate measures on prompts the head never saw)"
    return None


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    detail: str


def transition_refusal(state: str, to: str, role: Role, rationale: str | None) -> Refusal | None:
    """Why a person with `role` may not move a head from `state` to `to`, or None when they may.

    409 for a move the lifecycle has not, 403 for a role too low, 422 for a missing rationale.
    """
    if to not in LIFECYCLE.get(state, frozenset()):
        legal = ", ".join(sorted(LIFECYCLE.get(state, ()))) or "none"
        return Refusal(409, f"a {state} head cannot move to {to} (its moves: {legal})")
    if to == "production":
        if role not in _PRODUCTION_ROLES:
            return Refusal(
                403,
                "moving a head to production needs the admin or head_reviewer role; "
                f"the token has {role.value}",
            )
    elif ROLE_RANK[role] < ROLE_RANK[Role.DEVELOPER]:
        return Refusal(
            403, f"moving a head to {to} needs the developer role or above; the token has {role.value}"
        )
    if to in RATIONALE_REQUIRED and not (rationale and rationale.strip()):
        return Refusal(422, f"moving a head to {to} needs a rationale")
    return None


# --- the fold ---------------------------------------------------------------------------------


def open_head(envelope: Envelope[HeadRequested]) -> HeadResponse:
    """The head a head.requested opens: training, nothing learned yet."""
    requested = envelope.payload
    request = requested.request
    return HeadResponse(
        id=requested.head_id,
        name=request.name,
        state="training",
        target=request.target,
        family=request.family,
        created_at=envelope.occurred_at,
        updated_at=envelope.occurred_at,
        request=request,
    )


def fold(head: HeadResponse, envelope: Envelope[Any]) -> HeadResponse:
    """The head after one of its events (any order; a move the lifecycle has not is ignored)."""
    payload = envelope.payload
    update: dict[str, Any] = {}
    if isinstance(payload, HeadEpochCompleted):
        epochs = [e for e in head.epochs if e.epoch != payload.epoch.epoch] + [payload.epoch]
        update["epochs"] = sorted(epochs, key=lambda e: e.epoch)
    elif isinstance(payload, HeadTrained):
        update["artifact"] = payload.artifact
    elif isinstance(payload, HeadGated):
        update["artifact"] = payload.artifact
        update["gate"] = payload.result
    elif isinstance(payload, HeadFailed):
        if head.state == "training":
            update["error"] = payload.message
    elif isinstance(payload, HeadTransitioned):
        move = payload.transition
        if move.from_state != head.state or move.to_state not in LIFECYCLE[head.state]:
            return head
        update["state"] = move.to_state
        update["transitions"] = [*head.transitions, move]
        if move.to_state == "rejected" and head.gate is not None:
            update["error"] = head.gate.reason
    if not update:
        return head
    return head.model_copy(update=update)


def transitioned(head: HeadResponse, move: HeadTransition) -> HeadTransitioned:
    """The head.transitioned announcing `move` of `head`, with what the predictor needs to offer it."""
    return HeadTransitioned(
        head_id=head.id,
        tenant_target=head.target,
        family=head.family,
        transition=move,
        artifact=head.artifact,
        acceptance_rate=head.gate.acceptance_rate if head.gate is not None else None,
        mean_acceptance_length=head.gate.mean_acceptance_length if head.gate is not None else None,
    )


def person_transition(
    head: HeadResponse, to: HeadState, *, actor: str, role: Role, rationale: str | None, at: datetime
) -> HeadTransitioned:
    move = HeadTransition(
        from_state=head.state, to_state=to, actor=actor, role=role.value, rationale=rationale, at=at
    )
    return transitioned(head, move)


def service_transition(head: HeadResponse, envelope: Envelope[Any]) -> HeadTransitioned | None:
    """The move a service's verdict leads to, folded into `head` already: a training head that
    was gated becomes validated (passed) or rejected, one that failed becomes failed."""
    payload = envelope.payload
    if head.state != "training":
        return None
    if isinstance(payload, HeadGated):
        to: HeadState = "validated" if payload.result.passed else "rejected"
        actor, rationale = GATE_ACTOR, payload.result.reason
    elif isinstance(payload, HeadFailed):
        to, actor, rationale = "failed", envelope.producer, payload.message
    else:
        return None
    move = HeadTransition(
        from_state=head.state,
        to_state=to,
        actor=actor[:128],
        role=SERVICE_ROLE,
        rationale=rationale[:500],
        at=envelope.occurred_at,
    )
    return transitioned(head, move)


def derived_event_id(envelope: Envelope[Any]) -> str:
    """The id of the head.transitioned a service's event leads to: a redelivery derives the same."""
    return str(uuid.uuid5(_TRANSITION_NAMESPACE, str(envelope.event_id)))


def forgets_winners(move: HeadTransition) -> bool:
    """A deprecated head leaves the winner cache: no cached answer may name it any more."""
    return move.to_state == "deprecated"


def writes_approval(move: HeadTransition) -> bool:
    return move.to_state == "production"


def dead_letter_failure(letter: DeadLetter, producer: str) -> Envelope[HeadFailed] | None:
    """The head.failed (error_stage dead_letter) that ends a head whose event a service gave up
    on (a trainer that keeps dying on a head.requested, a gate on its head.trained); None when
    the letter holds no head event, or only one of the registry's own. Its id derives from the
    head, so however many of the head's events are parked, it fails once."""
    try:
        parked = parse_event(letter.data)
    except ValueError:
        return None
    payload = parked.payload
    if not isinstance(payload, HeadEvent) or isinstance(payload, HeadFailed | HeadTransitioned):
        return None
    error = letter.brief_error(DEAD_LETTER_ERROR_CHARS)
    message = (
        f"{letter.service} gave up on {parked.type} after {letter.deliveries} deliveries and parked "
        f"it on the dead-letter queue: {error} (once that is fixed, submit the head again)"
    )
    failed = HeadFailed(head_id=payload.head_id, error_stage=ErrorStage.DEAD_LETTER, message=message)
    event_id = str(uuid.uuid5(_DEAD_LETTER_NAMESPACE, payload.head_id))
    return parked.follow(failed, producer=producer).model_copy(update={"event_id": event_id})
