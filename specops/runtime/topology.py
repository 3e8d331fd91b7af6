"""The durable consumers each service binds on the SPEC stream, read from the services' own code.

Every service registers its handlers on its broker before the broker starts (`subscribe`
in its app module; the gateway's projector through `projector.register`), and
`SpecBroker.declare_consumer` collects the `ConsumerConfig` of each. Registering them
on a broker that never connects yields exactly the durable names and filter subjects
the running services use, so what a deployment has to name (KEDA triggers in infra/,
NATS permissions) is derived from, or checked against, this and cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js.api import ConsumerConfig

from specbus import RetryPolicy, make_broker
from specbus.broker import SpecBroker
from specops_services.audit import app as audit
from specops_services.benchmark_runner import app as benchmark_runner
from specops_services.gateway import projector
from specops_services.predictor import app as predictor
from specops_services.quality_gate import app as quality_gate

# The pools, planners and runners the handlers close over are only touched when a
# message arrives, which on a broker that never connects is never.
_UNUSED: Any = object()
# Registration never connects; the URL only has to parse.
_NO_SERVER = "nats://127.0.0.1:4222"


@dataclass(frozen=True, slots=True)
class Consumer:
    """One durable pull consumer on the SPEC stream; replicas of its service share it."""

    durable: str
    """Its name, `<service>-<handler>` (specbus.consumer_name)."""
    subjects: tuple[str, ...]
    """The subjects it is filtered on, e.g. `spec.run.*.requested`."""


# Service name as `specops serve` takes it -> how that service registers its handlers.
# The runner's retry is given because its default reads the runner's settings; a retry
# policy changes ack waits and backoff, never a durable name or a filter.
_REGISTRATIONS: dict[str, Callable[[SpecBroker], None]] = {
    "gateway": lambda broker: projector.register(broker, _UNUSED),
    "predictor": lambda broker: predictor.subscribe(broker, _UNUSED, _UNUSED),
    "benchmark-runner": lambda broker: benchmark_runner.subscribe(
        broker, _UNUSED, _UNUSED, retry=RetryPolicy()
    ),
    "quality-gate": lambda broker: quality_gate.subscribe(broker, _UNUSED, _UNUSED),
    "audit": lambda broker: audit.subscribe(broker, _UNUSED),
}


def bus_consumers() -> dict[str, list[Consumer]]:
    """Per service (its `specops serve` name), its durable consumers in the order it registers them.

    The gateway's is its projector, which a gateway started with
    `SPECOPS_GATEWAY_PROJECTOR=false` does not bind.
    """
    found: dict[str, list[Consumer]] = {}
    for service, register in _REGISTRATIONS.items():
        broker = make_broker(_NO_SERVER, service=service)
        register(broker)
        found[service] = [_consumer(config) for config in broker.consumer_configs]
    return found


def _consumer(config: ConsumerConfig) -> Consumer:
    if not config.durable_name:
        raise ValueError(f"consumer {config.name!r} is not durable")
    subjects = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    return Consumer(durable=config.durable_name, subjects=tuple(subjects))
