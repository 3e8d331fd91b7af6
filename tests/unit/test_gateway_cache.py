"""The gateway's winner cache without a database: its key, its lifetime, what a run leaves to it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from specbus.envelope import Envelope, new_event
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import ErrorStage, RunStatus
from specops_schemas.events import RunCompleted, RunFailed, RunRunning
from specops_services.gateway import winner_cache as cache
from specops_services.gateway.runs import logic as run_logic

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def request(
    model: str = "smollm2-135m-instruct", gpu: str = "cpu", engine: str = "speccore"
) -> RunCreateRequest:
    return RunCreateRequest.model_validate(
        {"target": {"model_ref": model, "gpu": gpu, "engine": engine}, "workload": {"fingerprint": "chat"}}
    )


def test_key_columns_are_the_canonical_key_of_a_request() -> None:
    code = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "h100", "engine": "speccore"},
            "workload": {"fingerprint": "code"},
        }
    )
    key = cache.key_columns(code, tenant_id="acme")
    assert key == {
        "cache_scope": "acme",
        "model_ref": "smollm2-135m-instruct",
        "gpu": "H100-80GB",
        "engine": "speccore",
        "engine_version": "",
        "fingerprint": "code",
        "mode": "interactive",
        "quality_gate": "topk5",
    }
    assert tuple(key) == cache.KEY_COLUMNS


def test_a_stated_gpu_count_is_another_deployment_and_another_key() -> None:
    def gpu_key(**target: object) -> str:
        req = RunCreateRequest.model_validate(
            {
                "target": {"model_ref": LLAMA_70B, "gpu": "h100", "engine": "vllm", **target},
                "workload": {"fingerprint": "chat"},
            }
        )
        return cache.key_columns(req, tenant_id="acme")["gpu"]

    assert gpu_key() == "H100-80GB"
    assert gpu_key(gpu_count=2) == "H100-80GBx2"
    assert gpu_key(gpu_count=4) != gpu_key(gpu_count=2)


def test_cache_entries_expire_after_30_days() -> None:
    assert timedelta(days=30) == cache.CACHE_TTL


def test_only_the_answer_that_completes_a_run_is_cached() -> None:
    def event(payload: RunCompleted | RunFailed | RunRunning) -> Envelope[Any]:
        return new_event(payload, tenant_id="acme", correlation_id="r1", producer="predictor")

    answer = RunCompleted(
        run_id="r1", cache_hit=False, measured=True, winner=None, candidates=[], pareto_front=[]
    )
    running = run_logic.RunState(RunStatus.RUNNING)
    completed = event(answer)
    done = run_logic.fold(running, completed)
    assert run_logic.answer_to_cache(running, done, completed) == answer

    hit = event(answer.model_copy(update={"cache_hit": True}))
    assert run_logic.answer_to_cache(running, run_logic.fold(running, hit), hit) is None
    # A redelivery (the run is completed already) or a late answer to a failed run.
    assert run_logic.answer_to_cache(done, done, completed) is None
    failed = run_logic.fold(
        running, event(RunFailed(run_id="r1", error_stage=ErrorStage.BENCHMARK, message="x"))
    )
    assert run_logic.answer_to_cache(failed, run_logic.fold(failed, completed), completed) is None
    # A run failed because a message was parked is completed once the message is redriven.
    parked = run_logic.fold(
        running, event(RunFailed(run_id="r1", error_stage=ErrorStage.DEAD_LETTER, message="x"))
    )
    assert run_logic.answer_to_cache(parked, run_logic.fold(parked, completed), completed) == answer
    measuring = event(RunRunning(run_id="r1", stage="measuring"))
    assert run_logic.answer_to_cache(running, run_logic.fold(running, measuring), measuring) is None
