"""Issue 16's trace acceptance test: one trace from `POST runs` through the predictor, the
benchmark runner and the quality gate to `run.completed`, across the real processes.

The services run as `specops up` starts them (tiny settings), with only the standard OTEL_*
variables set: their OTLP/HTTP exporters send to a collector the test runs itself, which
keeps every span it is sent in memory (decoded with opentelemetry-proto). The test then
reads the run's trace there: one trace id, a connected tree of spans, from each service.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch
from fixtures.runtime import TINY, started
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from specops.client import SpeculativeClient
from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    # On a CUDA host the `cpu` profile is predicted, not measured: no bench would run.
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
SERVICES = {"gateway", "predictor", "benchmark-runner", "quality-gate"}
# Every span of the run exported (batches leave each service every 200 ms).
TRACE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP (protobuf) trace receiver on 127.0.0.1 keeping what it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        spans = []
        for resource in request.resource_spans:
            resource_attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                spans += [
                    Span(
                        service=resource_attributes["service.name"],
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                    for s in scope.spans
                ]
        with self.server.lock:
            self.server.spans += spans
        body = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _run_trace(collector: Collector, run_id: str) -> list[Span]:
    """The spans of the trace `POST runs` started, once every span of it has arrived: the
    run's completion was consumed, and every span's parent is in the trace."""
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    while True:
        spans = collector.received()
        roots = [s for s in spans if s.kind == ProtoSpan.SPAN_KIND_SERVER and s.name.startswith("POST ")]
        trace = [s for s in spans if roots and s.trace_id == roots[0].trace_id]
        ids = {s.span_id for s in trace}
        done = any(s.name == "process spec.run.*.completed" for s in trace) and all(
            s.parent_id in ids for s in trace if s is not roots[0]
        )
        if len(roots) == 1 and done:
            return trace
        if time.monotonic() > deadline:
            names = sorted({(s.service, s.name) for s in spans})
            raise AssertionError(f"run {run_id}: no complete trace after {TRACE_TIMEOUT_S:g} s; got {names}")
        time.sleep(0.5)


def test_one_trace_from_post_runs_to_run_completed(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with started(monkeypatch, env=TINY | otel) as runtime:
        token = asyncio.run(issue_token(runtime.database_url, tenant_id="traced", role=Role.DEVELOPER))
        with SpeculativeClient(runtime.url, token.secret) as client:
            run = client.runs.create(
                target=TARGET, workload="chat", mode="interactive", goal={"quality_gate": "topk5"}
            )
            types = [event.type for event in client.runs.stream(run.id)]
        assert types[-1] == "run.completed", types
        trace = _run_trace(collector, run.id)

    every = collector.received()
    (root,) = [s for s in trace if s.parent_id == ""]
    assert root.service == "gateway" and root.kind == ProtoSpan.SPAN_KIND_SERVER
    assert root.attributes.get("http.route", "").endswith("/runs")
    # One trace, and no other: the probes, the event stream and the services' polling of
    # the database (the outbox relays, the gateway's listener) trace nothing.
    assert {s.trace_id for s in every} == {root.trace_id}
    assert {s.service for s in trace} >= SERVICES
    kinds = {s.kind for s in trace}
    assert {ProtoSpan.SPAN_KIND_PRODUCER, ProtoSpan.SPAN_KIND_CONSUMER, ProtoSpan.SPAN_KIND_CLIENT} <= kinds
    assert any(s.attributes.get("db.system") == "postgresql" for s in trace)

    processed = {(s.service, s.name) for s in trace if s.kind == ProtoSpan.SPAN_KIND_CONSUMER}
    assert ("predictor", "process spec.run.*.requested") in processed
    assert ("benchmark-runner", "process spec.bench.*.requested") in processed
    assert ("quality-gate", "process spec.bench.*.completed") in processed
    assert ("gateway", "process spec.run.*.completed") in processed
    consumers = [s for s in trace if s.kind == ProtoSpan.SPAN_KIND_CONSUMER]
    assert all(s.attributes["messaging.system"] == "nats" for s in consumers)
    assert all(run.id not in s.name for s in trace)
    sends = {s.span_id: s for s in trace if s.kind == ProtoSpan.SPAN_KIND_PRODUCER}
    assert all(s.parent_id in sends for s in consumers), "each message is processed under its send span"

    generations = [s for s in trace if "gen_ai.operation.name" in s.attributes]
    assert {s.service for s in generations} == {"benchmark-runner", "quality-gate"}
    assert all(s.attributes["gen_ai.request.model"] == TARGET["model_ref"] for s in generations)
    assert all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in generations)
