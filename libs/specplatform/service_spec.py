"""A bus service declared once: what `specops serve`, `specops up`, the NATS users and the
deployment checks know of it.

Each service exports one `ServiceSpec` (`SPEC` in `specops_services.<package>.service`), and
`specops_services.service_specs()` lists them. The spec itself stays cheap to import, since
every `specops` start lists the services (the choices of `specops serve`) and some of their
apps import torch; what running or wiring one takes, its `ServiceCode`, comes from
`spec.load()`, which imports its app.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbus.subjects import STREAM

if TYPE_CHECKING:
    from specbus.broker import SpecBroker
    from specbus.envelope import EventPayload
    from specplatform.settings import Settings

# Stands for what the handlers close over (pools, planners, runners) when they are registered
# only to be read: a broker that never connects delivers no message, so nothing touches it.
UNUSED: Any = object()
# A service's name is a NATS user, a seed file, a compose service and a Kubernetes Deployment.
_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


class Scaling(enum.StrEnum):
    """What adds a service's replicas in a deployment (infra/)."""

    BACKLOG = "backlog"
    """The pending messages of its durable consumers: a KEDA ScaledObject, one trigger a consumer."""
    CPU = "cpu"
    """Its CPU, a HorizontalPodAutoscaler: it answers HTTP, and its replicas share one port."""


@dataclass(frozen=True, slots=True)
class ServiceCode:
    """What running or wiring a service takes, read from its app module."""

    serve: Callable[[Settings | None], None]
    """Runs one process of it until SIGTERM / SIGINT, then stops it cleanly."""
    bus_name: str
    """Its name on the bus: consumers `<bus_name>-<handler>`, dead letters on
    `spec.dlq.<bus_name>`, request replies under `_INBOX.svc.<bus_name>.`."""
    register: Callable[[SpecBroker], object]
    """Registers its handlers on a broker as its process does, with UNUSED for what they close
    over; specops.runtime.topology reads the durable consumers off that broker."""
    publishes: tuple[type[EventPayload], ...] = ()
    """The events it publishes: its NATS user may publish their subjects and no other event's."""
    extra_publishes: tuple[str, ...] = ()
    """Subjects it publishes besides its events' (the gateway's copies to each tenant)."""
    streams: tuple[str, ...] = (STREAM,)
    """The streams it creates where they are missing."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One service as specops lists it."""

    name: str
    """Its name in `specops serve` and `specops up --replicas`, its NATS user, its compose service
    and its Kubernetes Deployment, e.g. `quality-gate`."""
    load: Callable[[], ServiceCode]
    """Imports its app and says how to run and wire it."""
    start_rank: int = 0
    """`specops up` starts the services by rank, lower first (ties in the order they are listed)
    and `specops down` stops them in reverse."""
    scaling: Scaling = Scaling.BACKLOG

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"service name {self.name!r}: lower-case words joined by '-', e.g. quality-gate")
