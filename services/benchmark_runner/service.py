"""The benchmark-runner as specops lists it (specplatform.service_spec); `load` imports its app
(and with it torch)."""

from __future__ import annotations

from specplatform.service_spec import UNUSED, ServiceCode, ServiceSpec


def load() -> ServiceCode:
    from specbus import RetryPolicy
    from specops_services.benchmark_runner import app, logic

    return ServiceCode(
        serve=app.serve,
        bus_name=app.SERVICE,
        # Its default retry reads the runner's settings; a retry policy changes ack waits and
        # backoff, never a durable name or a filter.
        register=lambda broker: app.subscribe(broker, UNUSED, UNUSED, retry=RetryPolicy()),
        publishes=logic.PUBLISHES,
    )


SPEC = ServiceSpec(name="benchmark-runner", load=load)
