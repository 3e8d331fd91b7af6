"""Traces of a service process, configured from the standard `OTEL_*` environment variables.

Off unless asked for: with no exporter named (`OTEL_TRACES_EXPORTER`) and no OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), or with
`OTEL_SDK_DISABLED=true`, no provider is installed and every span stays a no-op.

- `OTEL_TRACES_EXPORTER`: `otlp` (OTLP over HTTP/protobuf; the default once an endpoint
  is set), `console` (JSON spans on stdout, i.e. the service's log), `none`, or a comma list.
- `OTEL_SERVICE_NAME` (default: the specops service, e.g. `benchmark-runner`),
  `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS` / `_TIMEOUT` / `_COMPRESSION`,
  `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER` are read by the SDK itself.

Database spans come from psycopg's instrumentation, which would also make every poll of
the outbox relay and the run-events listener a trace of its own; the default sampler
therefore drops a database (client) span that has no parent, keeping those that belong
to a request or a message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes

from specplatform.errors import RuntimeSetupError

EXPORTERS = ("otlp", "console", "none")
OTLP_PROTOCOL = "http/protobuf"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


class OrphanClientsDropped(Sampler):
    """Root sampler: a client span (a database query) that would start a trace is dropped,
    any other root span is kept; children follow their parent (`ParentBased`)."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if kind == SpanKind.CLIENT:
            return SamplingResult(Decision.DROP)
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return "OrphanClientsDropped"


def exporter_names() -> list[str]:
    """The span exporters the environment asks for; [] when tracing is off."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not named:
        return ["otlp"] if any(env.get(name, "").strip() for name in _ENDPOINTS) else []
    names = [name.strip().lower() for name in named.split(",") if name.strip()]
    unknown = sorted(set(names) - set(EXPORTERS))
    if unknown:
        raise RuntimeSetupError(
            f"OTEL_TRACES_EXPORTER={named!r}: unknown exporter {', '.join(unknown)}; "
            f"use {', '.join(EXPORTERS)}"
        )
    return [name for name in names if name != "none"]


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    protocol = next(
        (os.environ[p].strip() for p in _PROTOCOLS if os.environ.get(p, "").strip()), OTLP_PROTOCOL
    )
    if protocol != OTLP_PROTOCOL:
        raise RuntimeSetupError(
            f"OTLP protocol {protocol!r} is not installed; set OTEL_EXPORTER_OTLP_PROTOCOL={OTLP_PROTOCOL} "
            "(a collector's port 4318)"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Endpoint, headers, timeout and compression come from the OTEL_EXPORTER_OTLP_* variables.
    return OTLPSpanExporter()


def configure_tracing(service: str) -> TracerProvider | None:
    """Install the process's tracer provider and database instrumentation, once, at start;
    None (nothing installed) when the environment does not ask for traces."""
    names = exporter_names()
    if not names:
        return None
    exporters = [_exporter(name) for name in names]
    # Explicit OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over the service's own name.
    resource = Resource.create({SERVICE_NAME: service}).merge(OTELResourceDetector().detect())
    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else ParentBased(OrphanClientsDropped())
    provider = TracerProvider(resource=resource, sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider)
    return provider
