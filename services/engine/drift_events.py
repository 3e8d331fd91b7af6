"""The I/O side of drift (drift.py decides): its Prometheus series, its log lines, and its
events on NATS when the server has a bus.

Metrics, in the server's registry, labelled ``model_name`` and ``workload`` (a known
workload, or ``other``), never the tenant: a label per tenant would grow without bound with
the names clients send, and tell anyone who reads /metrics how much each tenant asks.
``specops:spec_decode_drift_events_total{kind}`` (kind ``detected`` or ``recovered``),
and ``specops:spec_decode_active_method{method}`` (how many keys of the workload the method
decodes). No series carries one key's acceptance: with one tenant on a workload it would be
that tenant's acceptance, the side channel the security tiers guard; the events carry it.

Events: `spec.serve.<server_id>.drift_detected` / `drift_recovered`
(specops_schemas.serve), published on JetStream (the SPEC stream captures ``spec.>``) through
the server's bus (bus.py). A server without a bus only logs and counts; a publish that fails is
logged and the server goes on (the decision is already taken, the metric counts it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from specbus.envelope import Envelope, new_event
from speccatalog.workloads import WORKLOADS
from specops_schemas.serve import DriftDetected, DriftRecovered
from specops_services.engine.bus import PRODUCER, EngineBus
from specops_services.engine.drift import DriftKey, DriftMonitor, DriftPolicy, Measured, Transition
from specops_services.engine.logic import SpecCounts
from specops_services.engine.metrics import PREFIX

log = logging.getLogger(__name__)
OTHER_WORKLOAD = "other"


def workload_label(workload: str) -> str:
    """A workload as a metric label: a known workload's name, ``other`` for anything else (the
    header is the client's to choose: its values must not grow the series without bound)."""
    return workload if workload in WORKLOADS else OTHER_WORKLOAD


class DriftMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, methods: Sequence[str]) -> None:
        self.model_name = model_name
        self.methods = list(methods)
        labels = ["model_name", "workload"]
        self.events = Counter(
            PREFIX + "spec_decode_drift_events",
            "Drift decisions of the workload's keys: detected (to the fallback) or recovered (back).",
            [*labels, "kind"],
            registry=registry,
        )
        self.active = Gauge(
            PREFIX + "spec_decode_active_method",
            "Keys (tenant, workload) of the workload whose requests go to the method (probes aside).",
            [*labels, "method"],
            registry=registry,
        )
        self._on: dict[DriftKey, str] = {}  # each key's method

    def method(self, key: DriftKey, active: str) -> None:
        # One increment and one decrement, not a count over every key: clients name keys, so
        # a recount per new key would grow with all the names ever sent.
        label = workload_label(key.workload)
        was = self._on.get(key)
        if was == active:
            return
        self._on[key] = active
        for m in self.methods:  # every method's series of the workload, at 0 until it decodes
            self.active.labels(self.model_name, label, m)
        if was is not None:
            self.active.labels(self.model_name, label, was).dec()
        self.active.labels(self.model_name, label, active).inc()

    def transition(self, t: Transition) -> None:
        label = workload_label(t.key.workload)
        self.events.labels(self.model_name, label, t.kind).inc()
        self.method(t.key, t.method)


def drift_event(t: Transition, policy: DriftPolicy, server_id: str) -> Envelope[Any]:
    cls = DriftDetected if t.kind == "detected" else DriftRecovered
    payload = cls(
        server_id=server_id,
        tenant=t.key.tenant,
        workload=t.key.workload,
        primary_method=policy.primary,
        method=t.method,
        baseline_acceptance=t.baseline,
        current_acceptance=t.current,
        window=t.window,
        threshold=policy.threshold if t.kind == "detected" else policy.recover,
        requests=t.requests,
    )
    return new_event(payload, tenant_id=t.key.tenant, correlation_id=server_id, producer=PRODUCER)


class DriftReporter:
    """Logs, counts and (with a bus) publishes each transition; called on the worker thread."""

    def __init__(
        self, policy: DriftPolicy, metrics: DriftMetrics, server_id: str, bus: EngineBus | None = None
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.server_id = server_id
        self.bus = bus

    def report(self, t: Transition) -> None:
        log.warning(
            "drift %s for tenant %s, workload %s: %s acceptance %.3f over %d requests vs baseline %.3f; "
            "new requests go to %s",
            t.kind,
            t.key.tenant,
            t.key.workload,
            self.policy.primary,
            t.current,
            t.window,
            t.baseline,
            t.method,
        )
        self.metrics.transition(t)
        if self.bus is not None:
            self.bus.publish(drift_event(t, self.policy, self.server_id))


class DriftControl:
    """The worker's handle on drift: which method a request goes to, and what it measured."""

    def __init__(self, monitor: DriftMonitor, reporter: DriftReporter) -> None:
        self.monitor = monitor
        self.reporter = reporter

    def route(self, key: DriftKey) -> str:
        if key not in self.monitor.keys:
            self.reporter.metrics.method(key, self.monitor.active(key))
        return self.monitor.route(key)

    def finished(self, key: DriftKey, method: str, counts: SpecCounts) -> None:
        measured = Measured(drafted=counts.draft_tokens, accepted=counts.accepted, drafts=counts.drafts)
        active = self.monitor.active(key)
        transition = self.monitor.observe(key, method, measured)
        if transition is not None:
            self.reporter.report(transition)
        elif self.monitor.active(key) != active:  # auto moved between n-gram and plain
            log.info("drift fallback for %s now %s", key, self.monitor.active(key))
            self.reporter.metrics.method(key, self.monitor.active(key))
