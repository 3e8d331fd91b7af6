"""What a service parks on ``spec.dlq.<service>`` when it gives up on a message."""

from __future__ import annotations

from pydantic import Base64Bytes, Field

from specops_schemas.base import Model, UtcDatetime, utc_now


class DeadLetter(Model):
    """A failed message kept verbatim: it may not parse, so it is not wrapped in an Envelope."""

    service: str = Field(description="Service that gave up.")
    subject: str = Field(description="Subject the message was delivered on.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Its NATS headers (Nats-Msg-Id included)."
    )
    data: Base64Bytes = Field(description="Its body, base64-encoded.")
    deliveries: int = Field(ge=1, description="Delivery attempts made before parking.")
    error: str = Field(description="The last error, e.g. a validation message or exception text.")
    stream_sequence: int | None = Field(None, ge=1, description="Sequence in the SPEC stream, to replay it.")
    parked_at: UtcDatetime = Field(default_factory=utc_now, description="When it was parked, UTC.")
