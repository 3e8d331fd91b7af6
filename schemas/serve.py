"""Events of an engine server (`specops serve engine`) on `spec.serve.<server_id>.*`.

The server watches its primary method's acceptance per (tenant, workload); when it drifts
below its baseline the key's new requests go to a fallback (`drift_detected`), and when the
primary's acceptance on its probe requests recovers they go back (`drift_recovered`)
(services/engine/drift.py). The envelope's tenant is the request's tenant; its correlation id
the server id.

With `ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT` the server also classifies each request's prompt
and publishes every tenant's rolling summary of them on `spec.workload.<tenant>.summarized`
(services/engine/live_workload.py): fingerprint probabilities summed over the window, never
the prompts' text. The gateway keeps the latest per (tenant, model) for runs that ask for
`"fingerprint": "auto"` without samples.
"""

from __future__ import annotations

from pydantic import Field

from specbus.envelope import EventPayload
from specops_schemas.base import Fraction, Id
from specops_schemas.catalog import Fingerprint


class ServeEvent(EventPayload):
    """Base of the events on `spec.serve.<server_id>.*`."""

    server_id: Id = Field(description="The engine server (`--server-id`); the subject's id token.")

    @property
    def aggregate_id(self) -> str:
        return self.server_id


class DriftFields(ServeEvent):
    """What a drift decision saw, in both directions."""

    tenant: Id = Field(description="The requests' tenant (`X-Specops-Tenant`, else `default`).")
    workload: Id = Field(description="The requests' workload (`X-Specops-Workload`, else `default`).")
    primary_method: str = Field(min_length=1, description="The method the server serves by default.")
    method: str = Field(min_length=1, description="The method the key's new requests now go to.")
    baseline_acceptance: Fraction = Field(
        description="The primary's acceptance (accepted / drafted tokens) the key is judged against."
    )
    current_acceptance: Fraction = Field(description="The primary's rolling acceptance that decided.")
    window: int = Field(ge=1, description="Requests in the rolling window.")
    threshold: float = Field(gt=0.0, description="The fraction of the baseline that decided.")
    requests: int = Field(ge=1, description="Requests of the key the server has seen finish.")


class DriftDetected(DriftFields):
    """The primary's acceptance on a key fell below threshold x baseline: its requests go to the fallback."""

    event_type = "serve.drift_detected"


class DriftRecovered(DriftFields):
    """The primary's acceptance on the key's probe requests is back: its requests go to the primary."""

    event_type = "serve.drift_recovered"


class WorkloadSummarized(EventPayload):
    """A tenant's live workload on an engine server: its last requests' fingerprint probabilities,
    summed. On `spec.workload.<tenant>.summarized`; the envelope's time is the summary's."""

    event_type = "workload.summarized"

    server_id: Id = Field(description="The engine server (`--server-id`).")
    tenant: Id = Field(description="The requests' tenant (a taken `X-Specops-Tenant` claim).")
    model_ref: str = Field(
        min_length=1, max_length=512, description="The served target, as the server was started with it."
    )
    requests: int = Field(ge=1, description="Requests in the window (the tenant's latest, at most its size).")
    span_s: float = Field(ge=0.0, description="Seconds from the window's first request to its last.")
    probability_sums: dict[Fingerprint, float] = Field(
        description="Each fingerprint's probability summed over the window's requests (the classifier's "
        "`agentic` counted as `structured`); divided by `requests`, the pooled probabilities."
    )
    observed: int = Field(
        ge=1, description="Requests of the tenant this server has summarized since it started."
    )

    @property
    def aggregate_id(self) -> str:
        return self.tenant


SERVE_EVENT_TYPES: tuple[type[EventPayload], ...] = (DriftDetected, DriftRecovered, WorkloadSummarized)
