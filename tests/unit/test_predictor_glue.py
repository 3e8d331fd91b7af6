"""The predictor service's glue without servers: host detection, readiness, the cache key."""

from __future__ import annotations

import pytest

from specops_schemas.api import RunCreateRequest, Target
from specops_schemas.candidates import GateOutcome, Measurement
from specops_schemas.catalog import GateMethod
from specops_schemas.events import BenchPlan
from specops_services.predictor import cache, host, logic
from specops_services.predictor.hardware import UnknownHardware
from specops_services.predictor.settings import PredictorSettings


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None),  # not the 80 GB profile's memory
        ("NVIDIA L40S", "L40S"),
        ("Tesla T4", None),
    ],
)
def test_gpu_names_map_to_profiles(name: str, profile: str | None) -> None:
    assert logic.profile_of_gpu_name(name) == profile


def test_host_gpu_setting_overrides_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    assert host.host_info(PredictorSettings(host_gpu="auto")).gpu_profile == "H100-80GB"
    assert host.host_info(PredictorSettings(host_gpu="cpu")).cuda is False
    assert host.host_info(PredictorSettings(host_gpu="h200")).gpu_profile == "H200"
    monkeypatch.setattr(host, "gpu_name", lambda: None)
    assert host.host_info(PredictorSettings(host_gpu="auto")).cuda is False
    with pytest.raises(UnknownHardware):
        host.host_info(PredictorSettings(host_gpu="TPU-v9"))


def test_cache_key_columns_are_the_canonical_key_the_gateway_looks_up() -> None:
    request = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "h100", "engine": "speccore"},
            "workload": {"fingerprint": "code"},
        }
    )
    key = cache.key_columns(request, tenant_id="acme")
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


def _measured(cid: str) -> Measurement:
    return Measurement(
        candidate_id=cid,
        reps=1,
        tokens_per_s=1.0,
        tokens_per_s_stdev=0.0,
        speedup=1.0,
        acceptance_rate=0.0,
        mean_acceptance_length=1.0,
        per_position_acceptance=[],
        ttft_s=0.0,
        tpot_s=0.0,
        extra_memory_bytes=0,
    )


@pytest.mark.parametrize("method", [GateMethod.TOPK5, GateMethod.PENDING])
def test_pending_verdicts_are_final_only_under_the_pending_method(method: GateMethod) -> None:
    plan = BenchPlan(
        run_id="r1",
        target=Target(model_ref="smollm2-135m-instruct", gpu="cpu", engine="speccore"),
        fingerprint="chat",
        mode="interactive",
        quality_gate=method,
        candidates=[{"candidate_id": "a", "family": "ngram", "k": 2}],
        reps=1,
        n_prompts=1,
        max_new_tokens=1,
    )
    request = RunCreateRequest.model_validate({"target": plan.target, "workload": {"fingerprint": "chat"}})
    planned = logic.Bench("b1", "r1", "acme", request, plan)
    done = logic.Bench(
        "b1", "r1", "acme", request, plan, baseline=_measured("baseline"), results=[_measured("a")]
    )
    pending = {"a": GateOutcome(method=GateMethod.PENDING, passed=None)}
    assert not logic.is_ready(planned, {})
    assert not logic.is_ready(done, {})
    assert logic.is_ready(done, pending) == (method == GateMethod.PENDING)
    assert logic.is_ready(done, {"a": GateOutcome(method=GateMethod.TOPK5, passed=False)})
    assert logic.is_ready(
        logic.Bench("b1", "r1", "acme", request, plan, baseline=_measured("baseline"), results=[]), {}
    )
