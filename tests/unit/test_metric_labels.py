"""Metric labels and the gateway's HTTP metrics, without servers: a label never holds an id,
and every request is counted under its route template and status."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import REGISTRY

from specbus import metrics as bus_metrics
from specbus.subjects import template
from specops_schemas.api import API_PREFIX
from specops_services.gateway.app import create_app
from specops_services.gateway.settings import GatewaySettings


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("spec.run.r-123.requested", "spec.run.*.requested"),
        ("spec.bench.b_9.rep_measured", "spec.bench.*.rep_measured"),
        ("spec.dlq.predictor", "spec.dlq.predictor"),
        ("specops.intake.acme.run.requested", "specops.intake.*.run.requested"),
        # Shapes no event has: one label for all of them, whatever they hold.
        ("spec.nope.r-1.requested", "other"),
        ("spec.run.r-1.Bad-Event", "other"),
        ("spec.run.r-1", "other"),
        ("elsewhere.r-1", "other"),
    ],
)
def test_a_subject_template_keeps_the_kind_and_drops_the_id(subject: str, expected: str) -> None:
    assert template(subject) == expected


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        ("handled", bus_metrics.Verdict.CONSUMED),
        ("parked", bus_metrics.Verdict.PARKED),
        ("failed, retry in 5s", bus_metrics.Verdict.FAILED),
        ("not parked, retry in 30s", bus_metrics.Verdict.FAILED),
        # A verdict added later is one more attempt, not a lost message.
        ("transient, retry in 2s", bus_metrics.Verdict.FAILED),
    ],
)
def test_a_delivery_verdict_is_counted_as_consumed_failed_or_parked(
    verdict: str, expected: bus_metrics.Verdict
) -> None:
    assert bus_metrics.classify(verdict) is expected


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_delivery_is_counted_under_its_consumer_and_subject_template() -> None:
    labels = {"consumer": "unit-on_requested", "subject": "spec.run.*.requested"}
    before = _value("specops_bus_messages_parked_total", **labels)
    bus_metrics.record_delivery(
        consumer="unit-on_requested", subject="spec.run.r-42.requested", verdict="parked", seconds=0.01
    )
    assert _value("specops_bus_messages_parked_total", **labels) == before + 1
    assert _value("specops_bus_handler_duration_seconds_count", **labels) >= 1


async def test_http_requests_are_counted_by_route_template_and_status() -> None:
    settings = GatewaySettings(
        database_url="postgresql:///unused", nats_url="nats://unused", gateway_max_body_bytes=1024
    )
    app = create_app(settings)
    runs, run = f"{API_PREFIX}/runs", f"{API_PREFIX}/runs/{{run_id}}"
    cases = [
        ("GET", "/healthz", "/healthz", "200", None),
        # No token: refused before any database is needed.
        ("GET", f"{API_PREFIX}/runs/r-1", run, "401", None),
        ("GET", f"{API_PREFIX}/runs/r-2", run, "401", None),
        ("POST", runs, runs, "413", b"x" * 2048),
        ("GET", "/no/such/path", "unmatched", "404", None),
    ]
    expected: dict[tuple[str, str, str], float] = {}
    for method, _, route, status, _ in cases:
        key = (method, route, status)
        expected[key] = (
            expected.get(
                key, _value("specops_http_requests_total", method=method, route=route, status=status)
            )
            + 1
        )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        for method, path, _, status, body in cases:
            response = await client.request(method, path, content=body)
            assert response.status_code == int(status)
    for (method, route, status), count in expected.items():
        assert _value("specops_http_requests_total", method=method, route=route, status=status) == count
    assert _value("specops_http_request_duration_seconds_count", method="GET", route=run) >= 2
