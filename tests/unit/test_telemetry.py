"""Tracing's configuration from OTEL_* variables, the subject templates spans are named
after, and the span of one generation (in memory, on the real small model)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from specbus.subjects import template
from speccore.engine import Engine, Request
from speccore.models import LoadedModel
from speccore.proposers.base import ProposerConfig
from speccore.tracing import traced_generate
from specplatform.errors import RuntimeSetupError
from specplatform.telemetry import configure_tracing, exporter_names

OTEL = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, []),
    ],
)
def test_traces_are_off_unless_an_exporter_or_endpoint_is_set(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert exporter_names() == expected


def test_off_installs_nothing() -> None:
    assert configure_tracing("predictor") is None


def test_an_unknown_exporter_or_protocol_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(RuntimeSetupError, match="unknown exporter jaeger"):
        exporter_names()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(RuntimeSetupError, match="http/protobuf"):
        configure_tracing("predictor")


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("spec.run.r-1.requested", "spec.run.*.requested"),
        ("spec.bench.b_2.rep_measured", "spec.bench.*.rep_measured"),
        ("spec.dlq.quality_gate", "spec.dlq.quality_gate"),
        ("specops.intake.acme.run.requested", "specops.intake.*.run.requested"),
        ("specops.results.acme.run.r-1.run.completed", "specops.results.*.run.*.run.completed"),
        ("specops.results.acme.intake.accepted", "specops.results.*.intake.accepted"),
    ],
)
def test_subject_templates_hide_ids_and_tenants(subject: str, expected: str) -> None:
    assert template(subject) == expected


def test_a_generation_is_one_span_with_gen_ai_attributes(
    smollm: LoadedModel, spans: InMemorySpanExporter
) -> None:
    engine = Engine(smollm, "ngram", ProposerConfig(k=3))
    prompt = smollm.encode_prompt("Count: one two three one two three one two", chat=False)
    requests = [Request(prompt, max_new_tokens=8), Request(prompt[:-2], max_new_tokens=6)]

    generations = traced_generate(engine, requests)

    (span,) = spans.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert span.name == "text_completion smollm2-135m-instruct"
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "smollm2-135m-instruct"
    assert attributes["gen_ai.request.max_tokens"] == 8
    assert attributes["gen_ai.usage.input_tokens"] == 2 * len(prompt) - 2
    assert attributes["gen_ai.usage.output_tokens"] == sum(len(g.token_ids) for g in generations)
    assert attributes["specops.decoding.method"] == "ngram"
    assert attributes["specops.speculative.k"] == 3
    assert attributes["specops.batch_size"] == 2
    steps = sum(g.metrics.verify_steps for g in generations)
    accepted = sum(g.metrics.accepted_tokens for g in generations)
    assert attributes["specops.mean_acceptance_length"] == pytest.approx((accepted + steps) / steps)
