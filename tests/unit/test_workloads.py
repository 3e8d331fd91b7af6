"""Workloads declared once (speccatalog.workloads): what a run of each fingerprint is planned
with, and what the console reads from them."""

from __future__ import annotations

import pytest

from speccatalog.workloads import WORKLOADS, UnknownWorkload, temperature, workload_spec
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import Family, Fingerprint
from specops_services.predictor.calibration_set import calibration_point
from specops_services.predictor.plan import HostInfo, plan_run

CPU_HOST = HostInfo(cuda=False)


def plan(fingerprint: str, model: str = "smollm2-135m-instruct", gpu: str = "cpu"):
    target = {"model_ref": model, "gpu": gpu, "engine": "speccore"}
    body = {"target": target, "workload": {"fingerprint": fingerprint}}
    return plan_run(RunCreateRequest.model_validate(body), run_id="r", host=CPU_HOST)


def test_the_wire_takes_every_fingerprint_and_no_other_workload() -> None:
    assert [str(f) for f in Fingerprint] == [
        "chat", "code", "rag", "summarization", "structured", "reasoning", "creative", "long_context",
    ]  # fmt: skip
    assert "agentic" in WORKLOADS and "agentic" not in set(Fingerprint)


def test_a_run_is_planned_at_its_fingerprints_context_and_temperature() -> None:
    long = plan("long_context", model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB")
    chat = plan("chat", model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB")
    assert long.deployment.context_tokens == 32_768 > chat.deployment.context_tokens == 4096
    # smollm2's own context (8192) caps the working context.
    assert plan("long_context").deployment.context_tokens == 8192
    assert plan("creative").workload.temperature == 1.0
    assert plan("code").workload.temperature == 0.0


def test_chat_and_code_come_with_a_builtin_rest_datastore_and_rag_does_not() -> None:
    def rest_drafts(fingerprint: str) -> set[str]:
        return {r.candidate.draft for r in plan(fingerprint).ranked if r.candidate.family == Family.REST}

    assert rest_drafts("code") == {"builtin:code"}
    assert rest_drafts("rag") == set()


def test_an_extra_workload_is_served_as_the_fingerprint_it_stands_for() -> None:
    for name, spec in WORKLOADS.items():
        served = workload_spec(spec.fingerprint)
        assert (spec.context, spec.temperature) == (served.context, served.temperature), name
    agentic = calibration_point("smollm2-135m-instruct", "agentic")
    assert agentic.serving.fingerprint == Fingerprint.STRUCTURED
    assert temperature("agentic") == temperature("structured") == 0.0
    with pytest.raises(UnknownWorkload, match="valid workloads: chat, code"):
        temperature("poetry")


def test_each_wizard_answer_picks_one_fingerprint() -> None:
    answers = [(spec.answer.question, spec.answer.value) for spec in WORKLOADS.values() if spec.answer]
    assert len(answers) == len(set(answers)) == len(Fingerprint)
