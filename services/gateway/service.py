"""The gateway as specops lists it (specplatform.service_spec); `load` imports its app."""

from __future__ import annotations

from specbus.subjects import INTAKE_STREAM, RESULTS_STREAM, STREAM, results_pattern
from specplatform.service_spec import UNUSED, Scaling, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from specops_services.gateway import app

    return ServiceCode(
        serve=app.serve,
        bus_name=app.SERVICE,
        register=lambda broker: app.subscribe(broker, UNUSED),
        publishes=app.PUBLISHES,
        # It repeats each run's events to the run's tenant.
        extra_publishes=(results_pattern(),),
        # Besides SPEC: the upstream systems' requests and the copies of their runs' events.
        streams=(STREAM, INTAKE_STREAM, RESULTS_STREAM),
    )


# Last: everything that answers its requests is subscribed by the time it takes them.
SPEC = ServiceSpec(name="gateway", load=load, start_rank=1, scaling=Scaling.CPU)
