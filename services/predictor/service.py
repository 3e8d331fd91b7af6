"""The predictor as specops lists it (specplatform.service_spec); `load` imports its app."""

from __future__ import annotations

from specplatform.service_spec import UNUSED, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from specops_services.predictor import app, logic

    return ServiceCode(
        serve=app.serve,
        bus_name=app.SERVICE,
        register=lambda broker: app.subscribe(broker, UNUSED, UNUSED),
        publishes=logic.PUBLISHES,
    )


SPEC = ServiceSpec(name="predictor", load=load)
