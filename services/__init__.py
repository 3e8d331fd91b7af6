"""The bus services, each declared once: `SPEC` (a specplatform.service_spec.ServiceSpec) in
its package's `service.py`.

`service_specs()` is the one list of them, which everything that names services iterates:
`specops serve`'s choices, `specops up`'s start order, the NATS users and their permissions
(specops.runtime.topology), the checks of docker-compose.yml and infra/. The built-in ones are
the packages in BUILTIN; a separately installed package adds one under the `specops.services`
entry point::

    [project.entry-points."specops.services"]
    toy = "toy_service.service:SPEC"

A plugin cannot replace a built-in service, and one that does not load is an error naming its
entry point rather than a service silently missing.
"""

from __future__ import annotations

import functools
from importlib import import_module
from importlib.metadata import entry_points

from specplatform.errors import RuntimeSetupError
from specplatform.service_spec import ServiceSpec

ENTRY_POINT_GROUP = "specops.services"
# Packages under specops_services; equal start ranks start in this order.
BUILTIN = (
    "audit",
    "security",
    "quality_gate",
    "head_trainer",
    "benchmark_runner",
    "tuner",
    "predictor",
    "gateway",
)


@functools.cache
def service_specs() -> dict[str, ServiceSpec]:
    """Every service by name, in start order: by start rank, then the built-in ones in BUILTIN's
    order, then plugins by name."""
    found = [import_module(f"{__name__}.{package}.service").SPEC for package in BUILTIN]
    builtin = {spec.name for spec in found}
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"entry point '{point.name} = {point.value}' ({ENTRY_POINT_GROUP})"
        try:
            spec = point.load()
        except Exception as exc:
            raise RuntimeSetupError(f"{where} does not load: {type(exc).__name__}: {exc}") from exc
        if not isinstance(spec, ServiceSpec):
            raise RuntimeSetupError(f"{where} is a {type(spec).__name__}, not a ServiceSpec")
        if spec.name != point.name:
            raise RuntimeSetupError(f"{where} names a spec of service '{spec.name}'")
        if spec.name in builtin:
            raise RuntimeSetupError(f"{where} would replace the service '{spec.name}' specops already has")
        found.append(spec)
    return {spec.name: spec for spec in sorted(found, key=lambda spec: spec.start_rank)}


def service_names() -> tuple[str, ...]:
    """The services' names in start order."""
    return tuple(service_specs())


__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "service_names", "service_specs"]
