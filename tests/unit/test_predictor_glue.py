"""The predictor service's glue without servers: host detection, verdicts and readiness,
dead letters."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import pytest

from specbus.dlq import DeadLetter
from specbus.envelope import Envelope, new_event
from speccatalog.hardware import UnknownHardware
from specops_schemas.api import RunCreateRequest, Target
from specops_schemas.candidates import GateOutcome, Measurement
from specops_schemas.catalog import ErrorStage, GateMethod
from specops_schemas.events import BenchPlan, RunFailed, RunRunning
from specops_services.predictor import host, logic
from specops_services.predictor.plan import CPU_BENCH, GPU_BENCH, BenchDefaults
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


def test_bench_size_settings_override_the_profile_defaults() -> None:
    assert host.host_info(PredictorSettings(host_gpu="cpu")).bench is None
    small = host.host_info(PredictorSettings(host_gpu="cpu", bench_reps=1, bench_new_tokens=8)).bench
    assert small == BenchDefaults(reps=1, n_prompts=CPU_BENCH.n_prompts, max_new_tokens=8)
    gpu = host.host_info(PredictorSettings(host_gpu="h100", bench_prompts=2)).bench
    assert gpu == BenchDefaults(reps=GPU_BENCH.reps, n_prompts=2, max_new_tokens=GPU_BENCH.max_new_tokens)
    two = host.host_info(PredictorSettings(host_gpu="cpu", bench_candidates=2)).bench
    assert two == dataclasses.replace(CPU_BENCH, candidates=2)


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


def _plan(method: GateMethod) -> tuple[BenchPlan, RunCreateRequest]:
    """Run r1's bench plan of one ngram candidate on smollm2 (cpu), and its request."""
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
    return plan, RunCreateRequest.model_validate({"target": plan.target, "workload": {"fingerprint": "chat"}})


@pytest.mark.parametrize("method", [GateMethod.TOPK5, GateMethod.PENDING])
def test_pending_verdicts_are_final_only_under_the_pending_method(method: GateMethod) -> None:
    plan, request = _plan(method)
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


def _parked(payload: Any, run_id: str = "r1") -> Envelope[Any]:
    return new_event(payload, tenant_id="acme", correlation_id=run_id, producer="benchmark-runner")


def _letter_of(data: bytes, error: str = "RuntimeError: boom") -> DeadLetter:
    return DeadLetter(
        service="benchmark_runner",
        subject="spec.bench.b1.requested",
        data=base64.b64encode(data),
        deliveries=5,
        error=error,
    )


def test_a_dead_letter_names_the_run_its_event_would_leave_unfinished() -> None:
    running = _parked(RunRunning(run_id="r1", stage="measuring"))
    assert logic.parked_event(_letter_of(running.to_json_bytes())) == running
    assert logic.parked_event(_letter_of(b"{not json")) is None
    # What the predictor's own dead-letter handler gave up on: a letter inside a letter.
    nested = _letter_of(_letter_of(running.to_json_bytes()).model_dump_json().encode())
    assert logic.parked_event(nested) is None

    assert logic.parked_run(running) == "r1"
    assert logic.parked_run(_parked(RunRunning(run_id="r1", stage="measuring"), run_id="not an id")) is None
    assert logic.parked_run(running.model_copy(update={"tenant_id": "not a tenant"})) is None
    # A run's own end, parked by a service that could not take it, does not re-decide the run.
    ended = _parked(RunFailed(run_id="r1", error_stage=ErrorStage.BENCHMARK, message="no tokens"))
    assert logic.parked_run(ended) is None


def test_only_a_run_that_has_not_ended_can_be_failed_by_a_dead_letter() -> None:
    assert logic.can_fail(logic.RequestedRun("r1", "acme", ended=False))
    # Answered here (perhaps not projected yet), or failed by another service.
    assert not logic.can_fail(logic.RequestedRun("r1", "acme", ended=True))
    assert not logic.can_fail(None)  # no run of the tenant was requested here


def test_every_dead_letter_of_a_run_fails_it_with_one_event() -> None:
    measuring = _parked(RunRunning(run_id="r1", stage="measuring"))
    gating = _parked(RunRunning(run_id="r1", stage="gating"))
    first = logic.dead_letter_failed(_letter_of(measuring.to_json_bytes()), measuring)
    second = logic.dead_letter_failed(_letter_of(gating.to_json_bytes(), "x" * 10_000), gating)
    assert first.event_id == second.event_id
    assert (first.correlation_id, first.tenant_id, first.causation_id) == ("r1", "acme", measuring.event_id)
    failed = first.payload
    assert (failed.run_id, failed.error_stage) == ("r1", ErrorStage.DEAD_LETTER)
    assert "benchmark_runner" in failed.message and "run.running" in failed.message
    assert "queue: RuntimeError: boom (once that is fixed" in failed.message
    assert failed.message.endswith("`specops dlq redrive`)")
    assert len(second.payload.message) < 1000 and "... (once that is fixed" in second.payload.message
    other_run = _parked(RunRunning(run_id="r2", stage="measuring"), run_id="r2")
    assert logic.dead_letter_failed(_letter_of(b"{}"), other_run).event_id != first.event_id
