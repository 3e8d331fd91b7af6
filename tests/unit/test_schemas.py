"""The wire contract: envelope, subjects, event payloads, HTTP bodies, generated documents."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from specbus import subjects
from specbus.dlq import DeadLetter
from specbus.envelope import CLOUDEVENTS_ATTRIBUTES, Envelope, new_event
from speccore.metrics import GenerationMetrics
from specops_schemas import generate
from specops_schemas.api import (
    API_PREFIX,
    ApplyResponse,
    Problem,
    RunCreateRequest,
    RunStatusResponse,
    SglangConfig,
    VllmConfig,
)
from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Prediction, verdict_is_final
from specops_schemas.catalog import ErrorStage, Fingerprint, GateMethod
from specops_schemas.events import (
    EVENT_TYPES,
    BenchRepMeasured,
    GateEvaluated,
    RepMetrics,
    RunCompleted,
    RunQueued,
    RunRequested,
    RunRunning,
    parse_event,
)

GENERATED = Path(__file__).resolve().parents[2] / "schemas" / "generated"

# The body of the product spec's curl example, verbatim.
SEED_BODY: dict[str, Any] = {
    "target": {
        "model_ref": "meta-llama/Llama-3.1-70B-Instruct",
        "gpu": "H100-80GB",
        "engine": "vllm",
        "engine_version": "0.8.0",
    },
    "workload": {"fingerprint": "chat"},
    "mode": "interactive",
    "goal": {"quality_gate": "topk5", "priorities": {"throughput": 0.7, "latency": 0.3}},
}


def _requested() -> Envelope[RunRequested]:
    payload = RunRequested(
        run_id="r-1", request=RunCreateRequest.model_validate(SEED_BODY), requested_by="tok-1"
    )
    return new_event(payload, tenant_id="acme", correlation_id="r-1", producer="gateway")


def _result(cid: str, **kw: Any) -> CandidateResult:
    return CandidateResult(
        candidate=Candidate(candidate_id=cid, family="ngram", k=4),
        prediction=Prediction(
            rank=1,
            score=1.0,
            acceptance_rate=0.5,
            mean_acceptance_length=1.9,
            speedup=1.4,
            extra_memory_bytes=0,
        ),
        **kw,
    )


# --- envelope ---------------------------------------------------------------------------------


def test_event_round_trips_through_canonical_bytes() -> None:
    event = _requested()
    data = event.to_json_bytes()
    back = parse_event(data)
    assert isinstance(back.payload, RunRequested)
    assert back == event
    assert back.to_json_bytes() == data
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    assert event.subject == "spec.run.r-1.requested"


def test_follow_up_event_is_caused_by_the_previous_one() -> None:
    first = _requested()
    second = first.follow(RunRunning(run_id="r-1", stage="predicting"), producer="predictor")
    assert second.causation_id == first.event_id
    assert (second.tenant_id, second.correlation_id) == (first.tenant_id, first.correlation_id)
    assert second.event_id != first.event_id
    assert (second.type, second.producer, second.subject) == (
        "run.running",
        "predictor",
        "spec.run.r-1.running",
    )
    assert parse_event(second.to_json_bytes()).payload == RunRunning(run_id="r-1", stage="predicting")


def test_envelope_rejects_inconsistent_or_ambiguous_metadata() -> None:
    body = json.loads(_requested().to_json_bytes())
    with pytest.raises(ValidationError, match="does not match its payload type"):
        Envelope[RunRequested].model_validate(body | {"type": "run.queued"})
    with pytest.raises(ValidationError, match="timezone"):
        Envelope[RunRequested].model_validate(body | {"occurred_at": "2026-01-01T12:00:00"})
    with pytest.raises(ValidationError, match="not a UUID"):
        Envelope[RunRequested].model_validate(body | {"causation_id": "abc"})
    plus_two = datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    moved = Envelope[RunRequested].model_validate(body | {"occurred_at": plus_two.isoformat()})
    assert moved.occurred_at.utcoffset() == timedelta(0) and moved.occurred_at.hour == 12


def test_cloudevent_mapping_is_one_to_one() -> None:
    event = _requested()
    ce = event.to_cloudevent()
    assert ce["specversion"] == "1.0" and ce["id"] == event.event_id and ce["source"] == "gateway"
    assert ce["tenantid"] == "acme" and ce["subject"] == event.subject
    assert "causationid" not in ce  # absent attributes are omitted, not null
    assert set(CLOUDEVENTS_ATTRIBUTES.values()) - {"causationid"} <= ce.keys()
    assert Envelope[RunRequested].from_cloudevent(ce) == event
    follow = event.follow(RunQueued(run_id="r-1"), producer="predictor")
    assert Envelope[RunQueued].from_cloudevent(follow.to_cloudevent()) == follow


def test_non_finite_numbers_cannot_enter_an_event() -> None:
    with pytest.raises(ValidationError, match="finite"):
        BenchRepMeasured(
            bench_id="b-1",
            candidate_id="c1",
            rep=0,
            reps=1,
            metrics=RepMetrics.model_validate(GenerationMetrics().to_dict()),
            speedup=math.inf,
        )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"type": "run.exploded"}', "unknown event type 'run.exploded'"),
    ],
)
def test_parse_event_rejects_what_is_not_a_known_event(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_event(data)


def test_parse_event_validates_the_payload() -> None:
    body = json.loads(_requested().to_json_bytes())
    body["payload"]["request"]["workload"]["fingerprint"] = "poetry"
    with pytest.raises(ValidationError, match="fingerprint"):
        parse_event(json.dumps(body))


# --- subjects ---------------------------------------------------------------------------------


def test_subject_builders_and_parser_agree() -> None:
    built = subjects.subject("bench", "7f3c-2", "rep_measured")
    assert built == "spec.bench.7f3c-2.rep_measured"
    assert subjects.parse(built) == ("bench", "7f3c-2", "rep_measured")
    assert subjects.pattern("gate", "evaluated") == "spec.gate.*.evaluated"
    assert subjects.dlq_subject("predictor") == "spec.dlq.predictor"
    assert (subjects.STREAM, subjects.STREAM_SUBJECTS) == ("SPEC", "spec.>")


@pytest.mark.parametrize(
    ("subject", "message"),
    [
        ("spec.run.r1", "expected 'spec.<aggregate>.<id>.<event>'"),
        ("spec.run.r1.requested.extra", "expected"),
        ("other.run.r1.requested", "expected"),
        ("spec.job.r1.requested", "unknown aggregate 'job'"),
        ("spec.run..requested", "invalid subject id ''"),
        ("spec.run.*.requested", "invalid subject id"),
        ("spec.run.r1.Requested", "invalid subject event"),
        ("spec.dlq.predictor", "dead-letter subject"),
    ],
)
def test_malformed_subjects_are_rejected(subject: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace(".", r"\.")):
        subjects.parse(subject)


def test_builders_refuse_tokens_that_would_change_the_subject() -> None:
    with pytest.raises(ValueError, match="invalid subject id"):
        subjects.subject("run", "a.b", "requested")
    with pytest.raises(ValueError, match="invalid subject id"):
        subjects.subject("run", ">", "requested")
    with pytest.raises(ValueError, match="unknown aggregate"):
        subjects.pattern("runs")


# --- HTTP bodies ------------------------------------------------------------------------------


def test_seed_request_body_and_sdk_minimum_are_accepted() -> None:
    full = RunCreateRequest.model_validate(SEED_BODY)
    assert full.workload.fingerprint == Fingerprint.CHAT and full.goal.priorities.throughput == 0.7
    minimal = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": "code"},
        }
    )
    assert minimal.goal.quality_gate == GateMethod.TOPK5 and minimal.mode == "interactive"
    assert minimal.target.engine_version is None
    assert API_PREFIX == "/api/v1/inferenceiq/speculative"


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(SEED_BODY))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "pointer", "message"),
    [
        (("workload", "fingerprint"), "poetry", "#/workload/fingerprint", "'chat', 'code', 'rag'"),
        (("goal", "quality_gate"), "vibes", "#/goal/quality_gate", "'exact', 'topk5', 'logit_kl'"),
        (("target", "engine"), "tgi", "#/target/engine", "'speccore', 'vllm' or 'sglang'"),
        (("target", "gpus"), 8, "#/target/gpus", "Extra inputs are not permitted"),
        (("goal", "priorities", "throughput"), "fast", "#/goal/priorities/throughput", "valid number"),
        (("goal", "priorities"), {"throughput": 0, "latency": 0}, "#/goal/priorities", "must be positive"),
        (("target", "model_ref"), "", "#/target/model_ref", "at least 1 character"),
        # A vLLM server does not return the whole distribution logit_kl compares.
        (("goal", "quality_gate"), "logit_kl", "#", "needs each emitted token's whole distribution"),
    ],
)
def test_bad_requests_get_clear_problem_details(
    path: tuple[str, ...], value: Any, pointer: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        RunCreateRequest.model_validate(_with(path, value))
    problem = Problem.validation(caught.value.errors(), instance="/runs")
    assert problem.status == 422 and problem.errors is not None
    assert [e.pointer for e in problem.errors] == [pointer]
    assert message in problem.errors[0].detail and message in (problem.detail or "")
    assert json.loads(problem.model_dump_json(exclude_none=True))["type"] == "about:blank"


def test_problem_pointer_addresses_the_body_for_fastapi_errors() -> None:
    problem = Problem.validation([{"loc": ("body", "goal", "a/b"), "msg": "Field required"}])
    assert problem.errors is not None and problem.errors[0].pointer == "#/goal/a~1b"


def test_problem_keeps_extension_members() -> None:
    problem = Problem.model_validate({"title": "Conflict", "status": 409, "retry_after_s": 2})
    assert problem.model_dump()["retry_after_s"] == 2
    with pytest.raises(ValidationError, match="less than or equal to 599"):
        Problem(title="x", status=700)


def test_apply_response_picks_the_engine_config_by_its_discriminator() -> None:
    body = {
        "run_id": "r-1",
        "candidate_id": "c1",
        "family": "eagle",
        "config": {"engine": "sglang", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3},
        "cli_args": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"],
    }
    assert isinstance(ApplyResponse.model_validate(body).config, SglangConfig)
    body["config"] = {
        "engine": "vllm",
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
    }
    assert isinstance(ApplyResponse.model_validate(body).config, VllmConfig)
    body["config"] = {"engine": "tgi"}
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        ApplyResponse.model_validate(body)


# --- payload invariants -----------------------------------------------------------------------


def test_gate_rules_of_seed_000() -> None:
    with pytest.raises(ValidationError, match="'pending'"):
        GateOutcome(method="pending", passed=True)
    with pytest.raises(ValidationError, match="'pending'"):
        GateOutcome(method="topk5", passed=None)
    failed = GateOutcome(method="topk5", passed=False, score=0.9, threshold=0.95)
    with pytest.raises(ValidationError, match="quality_regression"):
        _result("c1", gate=failed)
    row = _result("c1", gate=failed, quality_preserved=0.0, error_stage="quality_regression")
    assert row.error_stage == ErrorStage.QUALITY_REGRESSION


def test_a_verdict_is_final_and_only_replaces_a_pending_one() -> None:
    pending = GateOutcome(method=GateMethod.PENDING, passed=None)
    passed = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95)
    failed = GateOutcome(method=GateMethod.TOPK5, passed=False, score=0.5, threshold=0.95)
    assert pending.replaces(None) and passed.replaces(pending)
    assert not failed.replaces(passed) and not pending.replaces(passed) and not pending.replaces(pending)
    # What the predictor, the tuner and the gate wait for: a verdict, or `pending` under `pending`.
    assert not verdict_is_final(None, GateMethod.TOPK5) and not verdict_is_final(pending, GateMethod.TOPK5)
    assert verdict_is_final(pending, GateMethod.PENDING) and verdict_is_final(failed, GateMethod.TOPK5)


def test_run_completed_is_consistent_about_the_winner() -> None:
    ok = _result("c1")
    unmeasured = RunCompleted(
        run_id="r-1", cache_hit=False, measured=False, winner=ok, candidates=[ok], pareto_front=["c1"]
    )
    assert unmeasured.winner == ok
    with pytest.raises(ValidationError, match="`measured` must be true exactly"):
        RunCompleted(
            run_id="r-1", cache_hit=False, measured=True, winner=ok, candidates=[ok], pareto_front=[]
        )
    with pytest.raises(ValidationError, match="not among the candidates: c9"):
        RunCompleted(
            run_id="r-1", cache_hit=True, measured=False, winner=ok, candidates=[ok], pareto_front=["c9"]
        )
    bad = _result("c2", error_stage="benchmark")
    with pytest.raises(ValidationError, match="disqualified"):
        RunCompleted(
            run_id="r-1", cache_hit=False, measured=False, winner=bad, candidates=[bad], pareto_front=[]
        )


def test_rep_events_carry_every_speccore_metric() -> None:
    gm = GenerationMetrics(prompt_tokens=10, new_tokens=9, total_time_s=1.0, ttft_s=0.2)
    gm.record_step(drafted=4, draft_depth=4, accepted=2)
    gm.record_step(drafted=4, draft_depth=4, accepted=4)
    assert set(RepMetrics.model_fields) == set(gm.to_dict())
    metrics = RepMetrics.model_validate(gm.to_dict())
    assert metrics.mean_acceptance_length == gm.mean_acceptance_length == 4.0
    assert metrics.per_position_acceptance == [1.0, 1.0, 0.5, 0.5]


def _models() -> set[type[BaseModel]]:
    """Every model reachable from the registry and the HTTP bodies."""
    seen: set[type[BaseModel]] = set()
    todo: list[Any] = [*EVENT_TYPES.values(), *generate.API_MODELS, DeadLetter, Envelope]
    while todo:
        item = todo.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item in seen:
                continue
            seen.add(item)
            todo.extend(f.annotation for f in item.model_fields.values())
        todo.extend(getattr(item, "__args__", ()))
    return seen


def test_every_field_is_described() -> None:
    missing = [
        f"{model.__name__}.{name}"
        for model in _models()
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert len(_models()) > 20
    assert missing == []


def test_status_response_embeds_the_request_as_accepted() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = RunStatusResponse(
        id="r-1",
        status="queued",
        created_at=now,
        updated_at=now,
        request=RunCreateRequest.model_validate(SEED_BODY),
    )
    again = RunStatusResponse.model_validate_json(status.model_dump_json())
    assert again == status and again.winner is None and again.cache_hit is False


# --- generated documents ----------------------------------------------------------------------


def test_asyncapi_has_a_channel_and_message_per_event_type() -> None:
    doc = generate.asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    names = {m["name"] for m in doc["components"]["messages"].values()}
    assert names == set(EVENT_TYPES) | {"dlq.parked"}
    for event_type, cls in EVENT_TYPES.items():
        channel = doc["channels"][event_type]
        aggregate, event = event_type.split(".", 1)
        assert subjects.parse(channel["address"].replace("{id}", "x1")) == (aggregate, "x1", event)
        message = doc["components"]["messages"][cls.__name__]
        schema_name = message["payload"]["$ref"].rsplit("/", 1)[1]
        assert doc["components"]["schemas"][schema_name]["properties"]["type"]["const"] == event_type
    assert doc["channels"]["dlq"]["address"] == "spec.dlq.{service}"


def test_generated_files_are_up_to_date() -> None:
    assert generate.stale_files(GENERATED) == [], "run `make asyncapi` and commit schemas/generated"


def test_check_mode_reports_stale_and_leftover_files(tmp_path: Path) -> None:
    generate.write(tmp_path)
    assert generate.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "asyncapi.json").write_text("{}\n")
    (tmp_path / "event.run.removed.schema.json").write_text("{}\n")
    assert generate.stale_files(tmp_path) == ["asyncapi.json", "event.run.removed.schema.json"]
    assert generate.main(["--out", str(tmp_path), "--check"]) == 1
    generate.write(tmp_path)
    assert generate.stale_files(tmp_path) == []


def test_gate_verdict_travels_on_the_gate_subject() -> None:
    verdict = GateEvaluated(
        bench_id="b-1", candidate_id="c1", method="logit_kl", passed=True, score=0.01, threshold=0.05
    )
    event = _requested().follow(verdict, producer="quality-gate")
    assert event.subject == "spec.gate.b-1.evaluated"
    assert parse_event(event.to_json_bytes()).payload == verdict


def test_parse_event_refuses_a_schema_version_newer_than_it_reads() -> None:
    body = json.loads(_requested().to_json_bytes())
    assert parse_event(json.dumps(body)).schema_version == 1
    body["schema_version"] = 2
    with pytest.raises(ValueError, match="run.requested schema version 2 is newer than this service reads"):
        parse_event(json.dumps(body))
