"""A span per generate call, with the OpenTelemetry GenAI attributes (`gen_ai.*`) and the
speculative decoding's own (`specops.*`: method, draft depth k, acceptance).

One span per call, not per token or step: a service decodes a batch of requests in one
call, and the span sums their usage. A no-op without an OpenTelemetry SDK (tracing off).

Glossary of the `specops.*` attributes (as in verify.py and metrics.py):
- verify_steps: target forward passes over a draft block;
- drafted / accepted tokens: draft tokens proposed / kept by the verifier;
- mean acceptance length: new tokens per verify step, (accepted + steps) / steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from speccore.engine import Engine, Generation, LogitsCallback, Request
from speccore.proposers import NONE

tracer = trace.get_tracer("speccore")

OPERATION = "text_completion"


def request_attributes(engine: Engine, requests: Sequence[Request]) -> dict[str, AttributeValue]:
    sampling = requests[0].sampling
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": "speccore",
        "gen_ai.request.model": engine.target.ref,
        "gen_ai.request.max_tokens": max(r.max_new_tokens for r in requests),
        "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.top_p": sampling.top_p,
        "gen_ai.request.top_k": sampling.top_k,
        "specops.decoding.method": engine.method,
        "specops.batch_size": len(requests),
    }
    if engine.method != NONE:
        attributes["specops.speculative.k"] = engine.config.k
    return attributes


def usage_attributes(generations: Sequence[Generation]) -> dict[str, AttributeValue]:
    metrics = [g.metrics for g in generations]
    steps = sum(m.verify_steps for m in metrics)
    drafted = sum(m.drafted_tokens for m in metrics)
    accepted = sum(m.accepted_tokens for m in metrics)
    return {
        "gen_ai.usage.input_tokens": sum(m.prompt_tokens for m in metrics),
        "gen_ai.usage.output_tokens": sum(m.new_tokens for m in metrics),
        "gen_ai.response.finish_reasons": [g.finish_reason for g in generations],
        "specops.verify_steps": steps,
        "specops.drafted_tokens": drafted,
        "specops.accepted_tokens": accepted,
        "specops.acceptance_rate": accepted / drafted if drafted else 0.0,
        "specops.mean_acceptance_length": (accepted + steps) / steps if steps else 0.0,
    }


def traced_generate(
    engine: Engine, requests: list[Request], on_logits: LogitsCallback | None = None
) -> list[Generation]:
    """`engine.generate(requests)` in a span `text_completion <model>`."""
    with tracer.start_as_current_span(
        f"{OPERATION} {engine.target.ref}",
        kind=SpanKind.INTERNAL,
        attributes=request_attributes(engine, requests),
    ) as span:
        generations = engine.generate(requests, on_logits=on_logits)
        span.set_attributes(usage_attributes(generations))
        return generations
