"""The bus's spans against a real nats-server and PostgreSQL, exported in memory: an event
committed to the outbox in one span is sent later by the relay, from no span at all, and
still continues that trace; its handler's span, and the queries in it, are children of the
send span; names carry the subject template, never the run id."""

from __future__ import annotations

import asyncio
import time
import uuid

from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from specbus import OutboxRelay, RetryPolicy, consumer_name, make_broker, outbox, subscriber
from specbus.envelope import Envelope, new_event
from specops_schemas.events import RunQueued
from specplatform.db import create_pool

WAIT_S = 10.0
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2,), ack_wait_s=5.0)


def _only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, [s.name for s in spans]
    return named[0]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_an_outbox_event_is_traced_from_its_commit_through_send_to_its_handler(
    nats_url: str, js: JetStreamContext, db: str, spans: InMemorySpanExporter
) -> None:
    service = f"svc_{uuid.uuid4().hex[:8]}"
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    event = new_event(RunQueued(run_id=run_id), tenant_id="acme", correlation_id=run_id, producer="tests")
    pool = create_pool(db, max_size=2)
    broker = make_broker(nats_url, service=service)
    handled = asyncio.Event()

    @subscriber(broker, service=service, events=RunQueued, retry=FAST, fetch_timeout_s=0.5)
    async def on_queued(received: Envelope[RunQueued]) -> None:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
        handled.set()

    await pool.open()
    await broker.start()
    try:
        with trace.get_tracer("tests").start_as_current_span("work") as work:
            async with pool.connection() as conn, conn.transaction():
                await outbox.add(conn, event)
        # The relay sends it from no span at all: its parent is the committed context.
        assert trace.get_current_span() is trace.INVALID_SPAN
        assert await OutboxRelay(pool, broker).publish_pending() == 1
        await asyncio.wait_for(handled.wait(), WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not any(s.name.startswith("process ") for s in spans.get_finished_spans()):
            assert time.monotonic() < deadline, "no process span was exported"
            await asyncio.sleep(0.05)
    finally:
        await broker.stop()
        await pool.close()

    finished = list(spans.get_finished_spans())
    send = _only(finished, "send spec.run.*.queued")
    process = _only(finished, "process spec.run.*.queued")
    queries = [s for s in finished if s.kind == SpanKind.CLIENT]
    assert {s.context.trace_id for s in finished} == {work.get_span_context().trace_id}
    assert send.kind == SpanKind.PRODUCER and _parent_id(send) == work.get_span_context().span_id
    assert process.kind == SpanKind.CONSUMER and _parent_id(process) == send.context.span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "nats",
        "messaging.destination.name": "spec.run.*.queued",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": event.event_id,
        "specops.correlation_id": run_id,
        "specops.run_id": run_id,
    }
    attributes = dict(process.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "spec.run.*.queued"
    assert attributes["messaging.consumer.group.name"] == consumer_name(service, "on_queued")
    assert attributes["messaging.message.id"] == event.event_id
    assert attributes["specops.run_id"] == run_id
    assert not any(run_id in s.name for s in finished)
    # The INSERT under `work` and the handler's SELECT; the relay's own polling is no trace.
    by_parent = {_parent_id(q) for q in queries}
    assert by_parent == {work.get_span_context().span_id, process.context.span_id}
    assert all("postgresql" in (q.attributes or {}).values() for q in queries)
