"""The head-trainer as specops lists it (specplatform.service_spec); `load` imports its app
(and with it torch)."""

from __future__ import annotations

from specplatform.service_spec import UNUSED, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from specbus import RetryPolicy
    from specops_services.head_trainer import app, logic

    return ServiceCode(
        serve=app.serve,
        bus_name=app.SERVICE,
        # Its default retry reads the trainer's settings; a retry policy changes ack waits and
        # backoff, never a durable name or a filter.
        register=lambda broker: app.subscribe(broker, UNUSED, UNUSED, retry=RetryPolicy()),
        publishes=logic.PUBLISHES,
    )


SPEC = ServiceSpec(name="head-trainer", load=load)
