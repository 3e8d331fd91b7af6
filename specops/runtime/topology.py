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
from specbus.consumer import filter_subjects
from specbus.envelope import EventPayload
from specbus.subjects import INTAKE_STREAM, RESULTS_STREAM, STREAM, results_pattern
from specops.runtime.nats_auth import BoundConsumer, ServiceUser
from specops_services.audit import app as audit
from specops_services.benchmark_runner import app as benchmark_runner
from specops_services.benchmark_runner import logic as benchmark_runner_logic
from specops_services.gateway import app as gateway
from specops_services.head_trainer import app as head_trainer
from specops_services.head_trainer import logic as head_trainer_logic
from specops_services.predictor import app as predictor
from specops_services.predictor import logic as predictor_logic
from specops_services.quality_gate import app as quality_gate
from specops_services.quality_gate import logic as quality_gate_logic
from specops_services.security import app as security
from specops_services.security import logic as security_logic
from specops_services.tuner import app as tuner
from specops_services.tuner import logic as tuner_logic

# The pools, planners and runners the handlers close over are only touched when a
# message arrives, which on a broker that never connects is never.
_UNUSED: Any = object()
# Registration never connects; the URL only has to parse.
_NO_SERVER = "nats://127.0.0.1:4222"


@dataclass(frozen=True, slots=True)
class Consumer:
    """One durable pull consumer; replicas of its service share it."""

    durable: str
    """Its name, `<service>-<handler>` (specbus.consumer_name)."""
    subjects: tuple[str, ...]
    """The subjects it is filtered on, e.g. `spec.run.*.requested`."""
    stream: str = STREAM
    """The stream it reads: SPEC, or SPEC_INTAKE for the gateway's intake."""


# Service name as `specops serve` takes it -> how that service registers its handlers.
# The runner's and the trainer's retry is given because their default reads their settings; a retry
# policy changes ack waits and backoff, never a durable name or a filter.
_REGISTRATIONS: dict[str, Callable[[SpecBroker], None]] = {
    "gateway": lambda broker: gateway.subscribe(broker, _UNUSED),
    "predictor": lambda broker: predictor.subscribe(broker, _UNUSED, _UNUSED),
    "tuner": lambda broker: tuner.subscribe(broker, _UNUSED, _UNUSED),
    "benchmark-runner": lambda broker: benchmark_runner.subscribe(
        broker, _UNUSED, _UNUSED, retry=RetryPolicy()
    ),
    "quality-gate": lambda broker: quality_gate.subscribe(broker, _UNUSED, _UNUSED),
    "head-trainer": lambda broker: head_trainer.subscribe(broker, _UNUSED, _UNUSED, retry=RetryPolicy()),
    "audit": lambda broker: audit.subscribe(broker, _UNUSED),
    "security": lambda broker: security.subscribe(broker, _UNUSED),
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
        found[service] = [_consumer(stream, config) for stream, config in broker.consumer_configs]
    return found


def _consumer(stream: str, config: ConsumerConfig) -> Consumer:
    if not config.durable_name:
        raise ValueError(f"consumer {config.name!r} is not durable")
    subjects = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    return Consumer(durable=config.durable_name, subjects=tuple(subjects), stream=stream)


# Service -> its name on the bus (consumer names, dead-letter subject, inbox prefix), the
# events it publishes and the streams it creates when they are missing.
_BUS: dict[str, tuple[str, tuple[type[EventPayload], ...], tuple[str, ...]]] = {
    "gateway": (gateway.SERVICE, gateway.PUBLISHES, (STREAM, INTAKE_STREAM, RESULTS_STREAM)),
    "predictor": (predictor.SERVICE, predictor_logic.PUBLISHES, (STREAM,)),
    "tuner": (tuner.SERVICE, tuner_logic.PUBLISHES, (STREAM,)),
    "benchmark-runner": (benchmark_runner.SERVICE, benchmark_runner_logic.PUBLISHES, (STREAM,)),
    "quality-gate": (quality_gate.SERVICE, quality_gate_logic.PUBLISHES, (STREAM,)),
    "head-trainer": (head_trainer.SERVICE, head_trainer_logic.PUBLISHES, (STREAM,)),
    "audit": (audit.SERVICE, (), (STREAM,)),
    "security": (security.SERVICE, security_logic.PUBLISHES, (STREAM,)),
}
# The gateway also repeats each run's events to the run's tenant (services/gateway/results.py).
_EXTRA_PUBLISHES = {"gateway": (results_pattern(),)}


def service_users() -> list[ServiceUser]:
    """What each service's NATS user must be allowed (specops.runtime.nats_auth)."""
    consumers = bus_consumers()
    users = []
    for service, (bus_name, events, streams) in _BUS.items():
        users.append(
            ServiceUser(
                name=service,
                bus_name=bus_name,
                publishes=(*filter_subjects(events), *_EXTRA_PUBLISHES.get(service, ())),
                consumers=tuple(BoundConsumer(c.stream, c.durable) for c in consumers[service]),
                streams=streams,
            )
        )
    return users
