"""The gateway's winner cache without a database: its key, its freshness, what a run leaves to it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specbus.envelope import Envelope, new_event
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import Engine, ErrorStage, Fingerprint, GateMethod, Mode, RunStatus
from specops_schemas.events import RunCompleted, RunFailed, RunRunning
from specops_services.gateway import cache, logic

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


KEY_FIELDS = {
    "model_ref": "m",
    "gpu": "cpu",
    "engine": Engine.SPECCORE,
    "engine_version": "0.1.0",
    "fingerprint": Fingerprint.CHAT,
    "mode": Mode.INTERACTIVE,
    "quality_gate": GateMethod.TOPK5,
}
OTHER_VALUES = {
    "model_ref": "m2",
    "gpu": "H100-80GB",
    "engine": Engine.VLLM,
    "engine_version": "0.1.1",
    "fingerprint": Fingerprint.CODE,
    "mode": Mode.BATCH,
    "quality_gate": GateMethod.EXACT,
}


def test_cache_key_is_stable_and_changes_with_each_field() -> None:
    base = cache.cache_key(**KEY_FIELDS)
    assert base == cache.cache_key(**KEY_FIELDS)
    assert re.fullmatch("[0-9a-f]{64}", base)
    for name, value in OTHER_VALUES.items():
        assert cache.cache_key(**(KEY_FIELDS | {name: value})) != base, name
    assert cache.cache_key(**KEY_FIELDS, tenant_id="t1") != base


def test_request_cache_key_canonicalises_the_gpu_and_resolves_the_engine_version() -> None:
    a = cache.request_cache_key(request(LLAMA_70B, gpu="h100", engine="vllm"), "0.8.0")
    b = cache.request_cache_key(request(LLAMA_70B, gpu="H100-80GB", engine="vllm"), "0.8.0")
    assert a == b
    assert cache.request_cache_key(request(LLAMA_70B, gpu="H100-80GB", engine="vllm"), "0.9.0") != b


def test_cache_entries_expire_after_30_days() -> None:
    now = datetime(2026, 11, 23, tzinfo=UTC)
    assert timedelta(days=30) == cache.CACHE_TTL
    assert cache.is_fresh(now - timedelta(days=29, hours=23), now)
    assert not cache.is_fresh(now - timedelta(days=30), now)
    with pytest.raises(ValueError, match="timezone"):
        cache.is_fresh(datetime(2026, 11, 1), now)


def test_only_the_answer_that_completes_a_run_is_cached() -> None:
    def event(payload: RunCompleted | RunFailed | RunRunning) -> Envelope[Any]:
        return new_event(payload, tenant_id="acme", correlation_id="r1", producer="predictor")

    answer = RunCompleted(
        run_id="r1", cache_hit=False, measured=True, winner=None, candidates=[], pareto_front=[]
    )
    running = logic.RunState(RunStatus.RUNNING)
    completed = event(answer)
    done = logic.fold(running, completed)
    assert logic.answer_to_cache(running, done, completed) == answer

    hit = event(answer.model_copy(update={"cache_hit": True}))
    assert logic.answer_to_cache(running, logic.fold(running, hit), hit) is None
    # A redelivery (the run is completed already) or a late answer to a failed run.
    assert logic.answer_to_cache(done, done, completed) is None
    failed = logic.fold(
        running, event(RunFailed(run_id="r1", error_stage=ErrorStage.DEAD_LETTER, message="x"))
    )
    assert logic.answer_to_cache(failed, logic.fold(failed, completed), completed) is None
    measuring = event(RunRunning(run_id="r1", stage="measuring"))
    assert logic.answer_to_cache(running, logic.fold(running, measuring), measuring) is None
