"""The engine server's pure parts: spec-decode counts from either kind of
batcher update, the OpenAI body checks, and which runs `--from-run` serves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from speccore.errors import SpecError
from speccore.metrics import GenerationMetrics
from specops.cli import main as specops
from specops.commands.serve_engine import served_winner
from specops_schemas.api import RunCreateRequest, RunStatusResponse
from specops_schemas.candidates import Candidate, CandidateResult, Measurement, Prediction
from specops_schemas.security import OPT_OUT_REASON
from specops_services.engine.logic import SpecCounts, update_counts
from specops_services.engine.protocol import ChatCompletionRequest, CompletionRequest


def _steps() -> tuple[list[tuple[int, int]], GenerationMetrics]:
    """Three steps of a chain of 3 (drafted, accepted), and the engine's metrics of them."""
    steps = [(3, 2), (0, 0), (3, 3)]
    m = GenerationMetrics()
    for drafted, accepted in steps:
        m.record_step(drafted, drafted, accepted)
    return steps, m


def test_counts_of_per_step_updates_and_of_one_finishing_update_agree() -> None:
    steps, whole = _steps()
    stepped = SpecCounts()
    for i, (drafted, accepted) in enumerate(steps):
        last = whole if i == len(steps) - 1 else None
        stepped.add(update_counts(stepped, drafted=drafted, accepted=accepted, finished_with=last))
    at_once = SpecCounts()
    at_once.add(update_counts(at_once, drafted=6, accepted=5, finished_with=whole))
    # vLLM's semantics: 2 drafts (a step that drafted nothing is none), 6 draft tokens,
    # 5 accepted; position 0 accepted twice, 1 twice, 2 once.
    assert stepped == at_once == SpecCounts(drafts=2, draft_tokens=6, accepted=5, accepted_per_pos=[2, 2, 1])


def test_bodies_refuse_what_the_server_does_not_do() -> None:
    ok = CompletionRequest(model="m", prompt="hi", stop="\n", logprobs=None, echo=False)
    assert ok.stop_strings == ("\n",) and ok.temperature == 1.0 and ok.max_tokens == 16
    refused = [
        {"echo": True},
        {"best_of": 2},
        {"temperature": -1},
        {"stop": ["a"] * 5},
        {"n": 0},
        {"stream_options": {"include_usage": True}},
    ]
    for bad in refused:
        with pytest.raises(ValidationError):
            CompletionRequest(model="m", prompt="hi", **bad)
    chat = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}], max_tokens=4
    )
    assert chat.messages[0].text() == "hi" and chat.token_limit == 4


def _run(
    status: str, *, engine: str = "speccore", measured: bool = True, winner: bool = True
) -> RunStatusResponse:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    candidate = Candidate(candidate_id="ngram-k4", family="ngram", k=4, options={"min_match": 2})
    measurement = Measurement(
        candidate_id="ngram-k4",
        reps=1,
        tokens_per_s=20.0,
        tokens_per_s_stdev=0.0,
        speedup=1.3,
        acceptance_rate=0.5,
        mean_acceptance_length=2.0,
        per_position_acceptance=[0.5],
        ttft_s=0.1,
        tpot_s=0.05,
        extra_memory_bytes=0,
    )
    prediction = Prediction(
        rank=1, score=1.0, acceptance_rate=0.5, mean_acceptance_length=2.0, speedup=1.2, extra_memory_bytes=0
    )
    result = CandidateResult(
        candidate=candidate, prediction=prediction, measurement=measurement if measured else None
    )
    request = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": engine},
            "workload": {"fingerprint": "chat"},
        }
    )
    return RunStatusResponse(
        id="r-1",
        status=status,
        created_at=now,
        updated_at=now,
        request=request,
        measured=measured if status == "completed" else None,
        winner=result if winner and status == "completed" else None,
    )


def test_from_run_serves_a_completed_speccore_runs_measured_winner() -> None:
    assert served_winner(_run("completed")).candidate_id == "ngram-k4"
    refusals = {
        "running, not completed": _run("running"),
        "for vllm, not speccore": _run("completed", engine="vllm"),
        "predicted, not measured": _run("completed", measured=False),
        "no winner": _run("completed", winner=False),
        OPT_OUT_REASON.split(" (")[0]: _run("completed", winner=False).model_copy(
            update={"speculation_disabled": OPT_OUT_REASON}
        ),
    }
    for words, run in refusals.items():
        with pytest.raises(SpecError, match=words):
            served_winner(run)


def test_bus_services_refuse_the_engine_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert specops(["serve", "gateway", "--model", "m", "--port", "9"]) == 2
    assert "--model, --port: only `specops serve engine` takes these" in capsys.readouterr().err
    assert specops(["serve", "engine"]) == 2
    assert "needs --model" in capsys.readouterr().err


def test_drift_options_are_checked_before_the_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["serve", "engine", "--model", "m", "--method", "eagle", "--head", "builtin:eagle"]
    refusals = {
        ("--drift-window", "4"): "--drift-window: drift control is off without --fallback",
        ("--fallback", "ngram", "--server-id", "a.b"): "--server-id must match",
        ("--fallback", "ngram", "--drift-threshold", "0.9"): "need 0 < threshold < recover",
    }
    for flags, words in refusals.items():
        assert specops([*base, *flags]) == 2
        assert words in capsys.readouterr().err
    assert specops(["serve", "engine", "--model", "m", "--method", "ngram", "--fallback", "none"]) == 2
    assert "no draft to drift" in capsys.readouterr().err
    assert specops(["serve", "gateway", "--fallback", "auto"]) == 2
    assert "--fallback: only `specops serve engine` takes these" in capsys.readouterr().err
