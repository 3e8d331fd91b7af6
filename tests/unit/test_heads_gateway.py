"""The gateway's pure decisions about T3 heads (services/gateway/heads/logic.py): who may move a
head where, and what each head.* event does to the registry's head."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from specbus.dlq import DeadLetter
from specbus.envelope import new_event
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import ErrorStage, Role
from specops_schemas.heads import (
    HeadArtifact,
    HeadEpoch,
    HeadEpochCompleted,
    HeadFailed,
    HeadGated,
    HeadGateResult,
    HeadRequested,
    HeadTrainingStarted,
    HeadTrainRequest,
)
from specops_services.gateway import winner_cache as cache
from specops_services.gateway.heads import logic as heads_logic

HEAD = "hd-" + "a" * 24
SHA = "b" * 64
AT = datetime(2026, 11, 25, 16, 0, tzinfo=UTC)


def request(**fields: object) -> HeadTrainRequest:
    return HeadTrainRequest.model_validate(
        {"target": "smollm2-135m-instruct", "family": "medusa", "train_data": SHA} | fields
    )


def requested():
    return new_event(
        HeadRequested(
            head_id=HEAD,
            request=request(name="mine"),
            train_path="head-data/acme/x.jsonl",
            requested_by="tok",
        ),
        tenant_id="acme",
        correlation_id=HEAD,
        producer="gateway",
    )


ARTIFACT = HeadArtifact(
    sha256=SHA, path=f"heads/acme/{SHA}", weights_sha256=SHA, target_weights="fp", num_heads=4, params=10
)


def gate_result(passed: bool) -> HeadGateResult:
    return HeadGateResult(
        passed=passed,
        reason="acceptance 0.41 >= 0.20, lossless" if passed else "acceptance 0.05 < 0.20",
        lossless=True,
        acceptance_rate=0.41 if passed else 0.05,
        mean_acceptance_length=1.8,
        speedup=1.2,
        tokens_per_s=100.0,
        baseline_tokens_per_s=80.0,
        n_prompts=4,
        max_new_tokens=32,
        hardware="cpu",
    )


def event(payload, producer: str = "quality-gate"):
    return new_event(payload, tenant_id="acme", correlation_id=HEAD, producer=producer)


@pytest.mark.parametrize(
    ("state", "to", "role", "rationale", "status"),
    [
        ("validated", "uat", Role.DEVELOPER, None, None),
        ("validated", "uat", Role.HEAD_REVIEWER, None, None),
        ("validated", "uat", Role.VIEWER, None, 403),
        ("uat", "production", Role.DEVELOPER, "good", 403),
        ("uat", "production", Role.HEAD_REVIEWER, None, 422),
        ("uat", "production", Role.HEAD_REVIEWER, "  ", 422),
        ("uat", "production", Role.HEAD_REVIEWER, "measured 1.4x", None),
        ("uat", "production", Role.ADMIN, "measured 1.4x", None),
        ("validated", "production", Role.ADMIN, "skip uat", 409),
        ("training", "uat", Role.ADMIN, None, 409),
        ("rejected", "deprecated", Role.ADMIN, "x", 409),
        ("deprecated", "deprecated", Role.ADMIN, "x", 409),
        ("production", "deprecated", Role.DEVELOPER, None, 422),
        ("production", "deprecated", Role.DEVELOPER, "regressed", None),
        ("uat", "deprecated", Role.VIEWER, "x", 403),
    ],
)
def test_transition_refusal(
    state: str, to: str, role: Role, rationale: str | None, status: int | None
) -> None:
    refusal = heads_logic.transition_refusal(state, to, role, rationale)
    assert (refusal.status if refusal else None) == status


def test_train_refusal() -> None:
    assert heads_logic.train_refusal(request(), eagle3=False) is None
    assert "ENABLE_L4_EAGLE3_TRAINING" in (
        heads_logic.train_refusal(request(family="eagle3"), eagle3=False) or ""
    )
    assert heads_logic.train_refusal(request(family="eagle3"), eagle3=True) is None
    assert heads_logic.train_refusal(request(heldout_data=SHA), eagle3=False) is not None
    assert heads_logic.eagle3_enabled({"ENABLE_L4_EAGLE3_TRAINING": "1"})
    assert not heads_logic.eagle3_enabled({"ENABLE_L4_EAGLE3_TRAINING": ""})


def test_fold_a_head_through_training_gating_and_people() -> None:
    head = heads_logic.open_head(requested())
    assert (head.state, head.name, head.family, head.epochs) == ("training", "mine", "medusa", [])
    started = heads_logic.fold(
        head, event(HeadTrainingStarted(head_id=HEAD, resumed_from_step=None, hardware="cpu"), "head-trainer")
    )
    assert started == head
    point = HeadEpoch(epoch=1, steps=3, tokens_seen=100, train_loss=2.0, heldout={}, elapsed_s=1.0)
    zero = point.model_copy(update={"epoch": 0, "train_loss": None})
    head = heads_logic.fold(head, event(HeadEpochCompleted(head_id=HEAD, epoch=point), "head-trainer"))
    head = heads_logic.fold(head, event(HeadEpochCompleted(head_id=HEAD, epoch=zero), "head-trainer"))
    head = heads_logic.fold(head, event(HeadEpochCompleted(head_id=HEAD, epoch=point), "head-trainer"))
    assert [e.epoch for e in head.epochs] == [0, 1]
    gated = event(HeadGated(head_id=HEAD, artifact=ARTIFACT, result=gate_result(True)))
    head = heads_logic.fold(head, gated)
    assert (head.state, head.artifact, head.gate) == ("training", ARTIFACT, gate_result(True))
    # The verdict's move, derived with a stable id, then folded as any head.transitioned.
    move = heads_logic.service_transition(head, gated)
    assert move is not None and heads_logic.derived_event_id(gated) == heads_logic.derived_event_id(gated)
    t = move.transition
    assert (t.from_state, t.to_state, t.actor, t.role) == ("training", "validated", "quality-gate", "service")
    assert (move.tenant_target, move.acceptance_rate, move.artifact) == (
        "smollm2-135m-instruct",
        0.41,
        ARTIFACT,
    )
    head = heads_logic.fold(head, event(move, "gateway"))
    assert head.state == "validated" and len(head.transitions) == 1
    # A verdict on a head that left training moves nothing; a replayed move is ignored.
    assert heads_logic.service_transition(head, gated) is None
    assert heads_logic.fold(head, event(move, "gateway")) == head
    uat = heads_logic.person_transition(head, "uat", actor="tok", role=Role.DEVELOPER, rationale=None, at=AT)
    head = heads_logic.fold(head, event(uat, "gateway"))
    assert head.state == "uat" and head.transitions[-1].role == "developer"
    prod = heads_logic.person_transition(
        head, "production", actor="tok2", role=Role.HEAD_REVIEWER, rationale="ok", at=AT
    )
    assert heads_logic.writes_approval(prod.transition) and not heads_logic.forgets_winners(prod.transition)
    head = heads_logic.fold(head, event(prod, "gateway"))
    gone = heads_logic.person_transition(
        head, "deprecated", actor="tok", role=Role.DEVELOPER, rationale="old", at=AT
    )
    assert heads_logic.forgets_winners(gone.transition)
    head = heads_logic.fold(head, event(gone, "gateway"))
    assert head.state == "deprecated" and [t.to_state for t in head.transitions] == [
        "validated", "uat", "production", "deprecated"
    ]  # fmt: skip
    assert head.state in heads_logic.FINAL_STATES


def test_rejected_and_failed_heads_say_why() -> None:
    head = heads_logic.open_head(requested())
    gated = event(HeadGated(head_id=HEAD, artifact=ARTIFACT, result=gate_result(False)))
    head = heads_logic.fold(head, gated)
    move = heads_logic.service_transition(head, gated)
    assert move is not None and move.transition.to_state == "rejected"
    head = heads_logic.fold(head, event(move, "gateway"))
    assert (head.state, head.error) == ("rejected", "acceptance 0.05 < 0.20")
    other = heads_logic.open_head(requested())
    failed = event(
        HeadFailed(head_id=HEAD, error_stage=ErrorStage.TRAINING, message="no examples"), "head-trainer"
    )
    other = heads_logic.fold(other, failed)
    move = heads_logic.service_transition(other, failed)
    assert move is not None and (move.transition.to_state, move.transition.actor) == (
        "failed",
        "head-trainer",
    )
    other = heads_logic.fold(other, event(move, "gateway"))
    assert (other.state, other.error) == ("failed", "no examples")


def test_projected_events_leave_out_the_gateways_own() -> None:
    types = {t.event_type for t in heads_logic.PROJECTED}
    assert "head.requested" not in types and "head.transitioned" not in types and "head.gated" in types


def test_runs_with_uat_heads_bypass_the_winner_cache() -> None:
    body = {
        "target": {"model_ref": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "H100-80GB", "engine": "vllm"},
        "workload": {"fingerprint": "chat"},
        "mode": "interactive",
        "goal": {"quality_gate": "topk5", "priorities": {"throughput": 0.7, "latency": 0.3}},
    }
    assert cache.cacheable(RunCreateRequest.model_validate(body))
    assert not cache.cacheable(RunCreateRequest.model_validate(body | {"include_uat_heads": True}))


def letter(body: bytes) -> DeadLetter:
    return DeadLetter(
        service="head_trainer",
        subject=f"spec.head.{HEAD}.requested",
        data=base64.b64encode(body),
        deliveries=5,
        error="MemoryError: " + "x" * 1000,
    )


def test_a_parked_head_event_fails_its_head_once() -> None:
    parked = requested()
    failed = heads_logic.dead_letter_failure(letter(parked.model_dump_json().encode()), "gateway")
    assert failed is not None and failed.payload.head_id == HEAD
    assert failed.payload.error_stage == ErrorStage.DEAD_LETTER and failed.tenant_id == parked.tenant_id
    assert (
        len(failed.payload.message) < 500
        and "head_trainer gave up on head.requested" in failed.payload.message
    )
    # A letter of the same head again (a redrive parked anew) derives the same event: it fails once.
    again = heads_logic.dead_letter_failure(letter(parked.model_dump_json().encode()), "gateway")
    assert again is not None and again.event_id == failed.event_id
    # A parked head.failed already says the head failed; a body that is no event names no head.
    own = new_event(
        HeadFailed(head_id=HEAD, error_stage=ErrorStage.TRAINING, message="x"),
        tenant_id="acme",
        correlation_id=HEAD,
        producer="head_trainer",
    )
    assert heads_logic.dead_letter_failure(letter(own.model_dump_json().encode()), "gateway") is None
    assert heads_logic.dead_letter_failure(letter(b"{not json"), "gateway") is None
