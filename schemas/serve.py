"""Events of an engine server (`specops serve engine`) on `spec.serve.<server_id>.*`.

The server watches its primary method's acceptance per (tenant, workload); when it drifts
below its baseline the key's new requests go to a fallback (`drift_detected`), and when the
primary's acceptance on its probe requests recovers they go back (`drift_recovered`)
(services/engine/drift.py). The envelope's tenant is the request's tenant; its correlation id
the server id.
"""

from __future__ import annotations

from pydantic import Field

from specbus.envelope import EventPayload
from specops_schemas.base import Fraction, Id


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


SERVE_EVENT_TYPES: tuple[type[ServeEvent], ...] = (DriftDetected, DriftRecovered)
