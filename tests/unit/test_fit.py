"""The fit check: the target's weights, KV cache and largest draft against the requested GPUs,
stated on the run instead of assumed in silence (issue 44, the spec's Example 1)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from specbus.envelope import new_event
from speccatalog.hardware import HardwareError, TargetDoesNotFit, check_fit, resolve_profile
from speccatalog.targets import resolve_target
from specops.client import RunEvent
from specops.commands.run import describe_event
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import ErrorStage
from specops_services.predictor.plan import HostInfo, error_stage, plan_run

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
HOST = HostInfo(cuda=False)


def example_1(**target: Any) -> RunCreateRequest:
    """The seed's T1 curl body, as written, with `target` fields added or replaced."""
    return RunCreateRequest.model_validate(
        {
            "target": {
                "model_ref": LLAMA_70B,
                "gpu": "H100-80GB",
                "engine": "vllm",
                "engine_version": "0.8.0",
                **target,
            },
            "workload": {"fingerprint": "chat"},
            "mode": "interactive",
            "goal": {"quality_gate": "topk5", "priorities": {"throughput": 0.7, "latency": 0.3}},
        }
    )


def test_example_1_states_that_bf16_does_not_fit_one_h100_and_offers_fp8_or_two_gpus() -> None:
    plan = plan_run(example_1(), run_id="r", host=HOST)
    fit = plan.run_predicted().fit
    assert fit is not None
    assert not fit.fits_as_requested
    assert (fit.requested_gpus, fit.gpus_stated, fit.planned_gpus, fit.weight_dtype) == (1, False, 2, "bf16")
    assert plan.deployment.devices == 2
    assert "does not fit" in fit.summary and "the request names no gpu_count" in fit.summary
    fp8, two = fit.options
    assert fp8.startswith("FP8 weights on 1 x H100-80GB")
    assert two.startswith("2 x H100-80GB in bf16") and "gpu_count to 2" in two
    one_bf16 = next(r for r in fit.rows if r.gpus == 1 and r.weight_dtype == "bf16")
    one_fp8 = next(r for r in fit.rows if r.gpus == 1 and r.weight_dtype == "fp8")
    assert one_bf16.weights_gib > one_bf16.usable_gib  # 131.4 GiB of weights, 72 GiB usable
    assert one_fp8.fits and not one_bf16.fits
    # The 8B draft (15.5 GiB, unsharded) does not fit beside the target on 2 GPUs; the plan prunes it.
    two_bf16 = next(r for r in fit.rows if r.gpus == 2 and r.weight_dtype == "bf16")
    assert fit.largest_draft == "meta-llama/Llama-3.1-8B-Instruct"
    assert two_bf16.fits and not two_bf16.fits_with_draft
    assert all(r.candidate.draft != fit.largest_draft for r in plan.ranked)


def test_a_stated_gpu_count_that_cannot_hold_the_target_is_refused_with_the_options() -> None:
    with pytest.raises(TargetDoesNotFit) as err:
        plan_run(example_1(gpu_count=1), run_id="r", host=HOST)
    assert error_stage(err.value) == ErrorStage.VALIDATION
    message = str(err.value)
    assert "1 x H100-80GB offers 72.0 GiB usable: it does not fit" in message
    assert "FP8 weights on 1 x H100-80GB" in message and "set target.gpu_count to 2" in message


def test_a_stated_gpu_count_that_holds_the_target_is_planned_on_exactly_that_many() -> None:
    plan = plan_run(example_1(gpu_count=4), run_id="r", host=HOST)
    fit = plan.run_predicted().fit
    assert fit is not None
    assert plan.deployment.devices == 4
    assert (fit.fits_as_requested, fit.planned_gpus, fit.options) == (True, 4, [])
    # The 8B draft fits beside a quarter of the target, so the plan offers it.
    assert any(r.candidate.draft == "meta-llama/Llama-3.1-8B-Instruct" for r in plan.ranked)


def test_fp8_is_offered_only_on_gpus_with_fp8_tensor_cores() -> None:
    target = resolve_target(LLAMA_70B)
    a100 = check_fit(target, resolve_profile("A100-80GB"), context_tokens=4096, batch=1)
    assert a100.fp8_rows == ()
    assert [o.split(" (")[0] for o in a100.options()] == ["2 x A100-80GB in bf16"]
    h200 = check_fit(target, resolve_profile("H200"), context_tokens=4096, batch=1)
    assert any(o.startswith("FP8 weights on 1 x H200") for o in h200.options())


def test_gpu_count_is_a_tensor_parallel_degree_the_profile_has() -> None:
    with pytest.raises(ValidationError, match="gpu_count must be 1, 2, 4, 8 or 16"):
        example_1(gpu_count=3)
    cpu = RunCreateRequest.model_validate(
        {
            "target": {
                "model_ref": "smollm2-135m-instruct",
                "gpu": "cpu",
                "engine": "speccore",
                "gpu_count": 2,
            },
            "workload": {"fingerprint": "chat"},
        }
    )
    with pytest.raises(HardwareError, match="a CPU host is one device"):
        plan_run(cpu, run_id="r", host=HOST)


def test_a_cpu_run_fits_one_host_and_states_it() -> None:
    cpu = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": "chat"},
        }
    )
    fit = plan_run(cpu, run_id="r", host=HOST).run_predicted().fit
    assert fit is not None
    assert (fit.fits_as_requested, fit.planned_gpus, fit.weight_dtype, fit.options) == (True, 1, "fp32", [])
    assert [r.gpus for r in fit.rows] == [1]
    assert fit.summary.endswith("it fits.")


def test_specops_run_prints_the_fit_only_when_the_requested_gpus_cannot_hold_the_target() -> None:
    def line(request: RunCreateRequest) -> str:
        predicted = plan_run(request, run_id="r", host=HOST).run_predicted()
        envelope = new_event(predicted, tenant_id="acme", correlation_id="r", producer="predictor")
        return describe_event(RunEvent(id="1", type="run.predicted", data={}, envelope=envelope))

    assert "fit: meta-llama/Llama-3.1-70B-Instruct in bf16 needs" in line(example_1())
    assert "fit:" not in line(example_1(gpu_count=2))
