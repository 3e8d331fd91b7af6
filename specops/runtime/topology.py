"""The durable consumers each service binds on the SPEC stream, and what its NATS user may do,
read from the services' own code.

Every service declares itself once (specplatform.service_spec; `specops_services.service_specs()`
lists them), and its spec's `load().register` registers its handlers on a broker as its process
does before the broker starts; `SpecBroker.declare_consumer` collects the `ConsumerConfig` of
each. Registering them on a broker that never connects yields exactly the durable names and
filter subjects the running services use, so what a deployment has to name (KEDA triggers in
infra/, NATS permissions) is derived from, or checked against, this and cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.api import ConsumerConfig

from specbus import make_broker
from specbus.consumer import filter_subjects
from specbus.subjects import STREAM
from specops.runtime.nats_auth import BoundConsumer, ServiceUser
from specops_services import service_specs

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


def bus_consumers() -> dict[str, list[Consumer]]:
    """Per service (its `specops serve` name), its durable consumers in the order it registers them.

    The gateway's is its projector, which a gateway started with
    `SPECOPS_GATEWAY_PROJECTOR=false` does not bind.
    """
    found: dict[str, list[Consumer]] = {}
    for service, spec in service_specs().items():
        broker = make_broker(_NO_SERVER, service=service)
        spec.load().register(broker)
        found[service] = [_consumer(stream, config) for stream, config in broker.consumer_configs]
    return found


def _consumer(stream: str, config: ConsumerConfig) -> Consumer:
    if not config.durable_name:
        raise ValueError(f"consumer {config.name!r} is not durable")
    subjects = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    return Consumer(durable=config.durable_name, subjects=tuple(subjects), stream=stream)


def service_users() -> list[ServiceUser]:
    """What each service's NATS user must be allowed (specops.runtime.nats_auth)."""
    consumers = bus_consumers()
    users = []
    for service, spec in service_specs().items():
        code = spec.load()
        users.append(
            ServiceUser(
                name=service,
                bus_name=code.bus_name,
                publishes=(*filter_subjects(code.publishes), *code.extra_publishes),
                consumers=tuple(BoundConsumer(c.stream, c.durable) for c in consumers[service]),
                streams=code.streams,
            )
        )
    return users
