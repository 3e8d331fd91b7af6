"""The reaper's deadlines, the dead-letter depth and the redrive's headers and listing: pure parts."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from specbus.dlq import DeadLetter, Redriven, depth_by_service, redrive_headers
from specbus.publish import MSG_ID
from specbus.subjects import redriven_subject
from specops.commands.dlq import ERROR_CHARS, detail, summary, table
from specops.runtime.dlq import ParkedLetter
from specops_schemas.catalog import ErrorStage, RunStatus
from specops_services.gateway.runs import logic as run_logic
from specops_services.gateway.settings import GatewaySettings

NOW = datetime(2026, 11, 25, 5, 0, tzinfo=UTC)
DEADLINES = GatewaySettings().stage_deadlines()


def progress(last_type: str | None, ago: timedelta, stage: str | None = None) -> run_logic.RunProgress:
    return run_logic.RunProgress("r1", "acme", last_type, stage, NOW - ago)


@pytest.mark.parametrize(
    ("last_type", "stage", "expected"),
    [
        (None, None, "queued"),
        ("run.queued", None, "queued"),
        ("run.running", "predicting", "predicting"),
        ("run.predicted", None, "benchmarking"),
        ("bench.requested", None, "benchmarking"),
        ("run.running", "measuring", "benchmarking"),
        ("bench.rep_measured", None, "benchmarking"),
        ("bench.completed", None, "gating"),
        ("run.running", "gating", "gating"),
        ("gate.evaluated", None, "gating"),
    ],
)
def test_a_run_waits_in_the_stage_its_latest_event_opened(
    last_type: str | None, stage: str | None, expected: str
) -> None:
    assert run_logic.stall_stage(progress(last_type, timedelta(0), stage)) == expected


def test_a_run_is_stalled_only_past_its_stages_deadline() -> None:
    benchmarking = DEADLINES["benchmarking"]
    assert run_logic.stalled(progress("bench.rep_measured", benchmarking), DEADLINES, NOW) is None
    stall = run_logic.stalled(
        progress("bench.rep_measured", benchmarking + timedelta(seconds=1)), DEADLINES, NOW
    )
    assert stall is not None and stall.stage == "benchmarking"
    # The same wait is past the deadline of a queued run, which is shorter on the CPU host.
    assert DEADLINES["queued"] < benchmarking
    assert run_logic.stalled(progress("run.queued", DEADLINES["queued"] * 1.5), DEADLINES, NOW) is not None


def test_the_failure_names_the_stage_and_what_to_check() -> None:
    failed = run_logic.Stall("benchmarking", timedelta(minutes=20, seconds=5)).failure("r1")
    assert failed.error_stage == ErrorStage.BENCHMARK
    assert failed.message == (
        "no progress in benchmarking for 20 min: is a benchmark-runner running? see `specops status`"
    )
    queued = run_logic.Stall("queued", timedelta(seconds=7)).failure("r1")
    assert queued.error_stage == ErrorStage.PREDICTION
    assert queued.message.startswith("no progress in queued for 7 s: is a predictor running?")


def test_stage_deadlines_are_settings() -> None:
    settings = GatewaySettings.model_validate({"stage_deadline_gating_s": 3})
    assert settings.stage_deadlines()["gating"] == timedelta(seconds=3)
    assert set(settings.stage_deadlines()) == set(run_logic.STALL_STAGES)


def test_a_dead_letter_failure_is_completed_by_a_later_answer_only() -> None:
    parked = run_logic.RunState(RunStatus.FAILED, error={"error_stage": "dead_letter", "message": "parked"})
    reaped = run_logic.RunState(RunStatus.FAILED, error={"error_stage": "benchmark", "message": "x"})
    assert run_logic.is_redrivable(parked) and not run_logic.is_redrivable(reaped)


def test_depth_counts_letters_not_redriven() -> None:
    letters = {"spec.dlq.predictor": 3, "spec.dlq.quality_gate": 1}
    redriven = {
        redriven_subject("predictor", 10): 2,  # redriven twice (--force): still one letter
        redriven_subject("predictor", 12): 1,
        redriven_subject("quality_gate", 2): 1,  # its letter retired by max_age
    }
    assert depth_by_service(letters, redriven, first_seq=5) == {"predictor": 1, "quality_gate": 1}


def _letter(**fields: object) -> DeadLetter:
    values: dict[str, object] = {
        "service": "predictor",
        "subject": "spec.run.r1.requested",
        "headers": {MSG_ID: "e1", "Nats-Expected-Stream": "SPEC", "traceparent": "00-ab-cd-01"},
        "data": base64.b64encode(b'{"a": 1}').decode(),
        "deliveries": 5,
        "error": "UndefinedTable: relation " + "x" * 200,
        "stream": "SPEC",
        "stream_sequence": 7,
    }
    return DeadLetter.model_validate(values | fields)


def test_a_redrive_keeps_the_headers_under_a_fresh_message_id() -> None:
    headers = redrive_headers(_letter(), "redrive-9-x")
    assert headers == {MSG_ID: "redrive-9-x", "traceparent": "00-ab-cd-01"}


def test_ls_and_show_say_what_was_parked_and_whether_it_was_redriven() -> None:
    when = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)
    record = Redriven(
        letter_seq=9, service="predictor", subject="spec.run.r1.requested", msg_id="m", republished_seq=20
    )
    fresh = ParkedLetter(9, when, _letter(), None)
    done = ParkedLetter(9, when, _letter(), record)
    assert summary(fresh)["redriven_at"] is None and summary(done)["redriven_at"] is not None
    header, row = table([fresh])
    assert header.split() == ["SEQ", "PARKED", "SERVICE", "SUBJECT", "REDRIVEN", "ERROR"]
    assert row.split()[:5] == ["9", "2026-11-25T04:00:00Z", "predictor", "spec.run.r1.requested", "-"]
    assert row.endswith("…") and len(row.split("  ")[-1].strip()) == ERROR_CHARS
    shown = detail(done)
    assert shown["body"] == {"a": 1} and shown["redrive"]["republished_seq"] == 20
    assert detail(ParkedLetter(9, when, _letter(data=base64.b64encode(b"\xff").decode()), None))["body"] == {
        "base64": "/w=="
    }


def test_show_prints_any_parked_body_even_nested_past_the_json_reader() -> None:
    when = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)
    nested = b"[" * 100_000 + b"]" * 100_000
    shown = detail(ParkedLetter(9, when, _letter(data=base64.b64encode(nested).decode()), None))
    assert shown["body"]["text"] == nested.decode() and "too deep" in shown["body"]["note"]
    assert json.loads(json.dumps(shown))["body"]["text"].startswith("[[[")
