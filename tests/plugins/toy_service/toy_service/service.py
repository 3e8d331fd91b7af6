"""The toy service as specops lists it; `load` imports its app."""

from __future__ import annotations

from specplatform.service_spec import UNUSED, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from toy_service import app

    return ServiceCode(
        serve=app.serve,
        bus_name=app.SERVICE,
        register=lambda broker: app.subscribe(broker, UNUSED),
        publishes=app.PUBLISHES,
    )


SPEC = ServiceSpec(name="toy", load=load)
