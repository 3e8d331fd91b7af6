"""The audit service as specops lists it (specplatform.service_spec); `load` imports its app.
It publishes no event: it only records them."""

from __future__ import annotations

from specplatform.service_spec import UNUSED, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from specops_services.audit import app

    return ServiceCode(
        serve=app.serve, bus_name=app.SERVICE, register=lambda broker: app.subscribe(broker, UNUSED)
    )


SPEC = ServiceSpec(name="audit", load=load)
