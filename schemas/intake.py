"""What upstream systems publish on NATS, and what they hear back.

An upstream system (a tenant's NATS user, `specops nats tenant add`) publishes an
`IntakeRequest` on `specops.intake.<tenant>.run.requested`. The gateway turns it into a
run exactly as `POST runs` does and says so on `specops.results.<tenant>.intake.accepted`
(`IntakeAccepted`: which run); the run's events are then repeated, as the envelopes the
services publish, on `specops.results.<tenant>.run.<run id>.<event type>` (e.g.
`...run.<id>.run.completed`). A request it cannot accept is answered on
`specops.results.<tenant>.intake.rejected` with an `IntakeRejected`, and the message
itself is parked on the gateway's dead-letter subject.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specbus.envelope import EventId
from specops_schemas.api import Problem, RunCreateBody, RunStatusResponse
from specops_schemas.base import Model, UtcDatetime


class IntakeRequest(Model):
    """A run request from an upstream system; the tenant is the one its subject names."""

    event_id: EventId = Field(
        description=(
            "The publisher's id of this request, a UUID (make it random: uuid4). Publishing the "
            "same event_id again (a retry) gives the same run; with another request it is refused."
        )
    )
    request: RunCreateBody = Field(description="The same body as `POST runs`.")


class IntakeAccepted(Model):
    """An intake request the gateway made a run of (or found the run of: a re-publish)."""

    type: Literal["intake.accepted"] = "intake.accepted"
    tenant_id: str = Field(description="The tenant whose intake subject it came on.")
    event_id: str = Field(description="The request's event_id.")
    run_id: str = Field(description="Its run: `GET runs/{id}`, and `specops.results.<tenant>.run.<id>.>`.")
    run: RunStatusResponse = Field(
        description="The run as `GET runs/{id}` shows it now: completed already on a winner-cache hit, "
        "or when a request is published again after its run ended."
    )
    stream_sequence: int = Field(ge=1, description="Its sequence in the SPEC_INTAKE stream.")
    accepted_at: UtcDatetime = Field(description="When it was accepted, UTC.")


class IntakeRejected(Model):
    """An intake request the gateway refused, and why."""

    type: Literal["intake.rejected"] = "intake.rejected"
    tenant_id: str = Field(description="The tenant whose intake subject it came on.")
    event_id: str | None = Field(None, description="The request's event_id, when it could be read.")
    stream_sequence: int = Field(ge=1, description="Its sequence in the SPEC_INTAKE stream.")
    problem: Problem = Field(description="Why, as the HTTP API would say it (RFC 9457).")
    rejected_at: UtcDatetime = Field(description="When it was refused, UTC.")
