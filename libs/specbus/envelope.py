"""The event envelope every bus message carries, generic over its payload, mapped 1:1 onto CloudEvents."""

from __future__ import annotations

import json
import uuid
from abc import abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Generic, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from specbus.subjects import subject
from specbus.wire import Model, UtcDatetime, loads_json, utc_now

CLOUDEVENTS_SPEC_VERSION = "1.0"
# Envelope field -> CloudEvents attribute. Extension names are lowercase alphanumerics
# (CloudEvents 1.0 naming rule), hence `tenantid` rather than `tenant_id`.
CLOUDEVENTS_ATTRIBUTES = {
    "event_id": "id",
    "type": "type",
    "occurred_at": "time",
    "producer": "source",
    "tenant_id": "tenantid",
    "correlation_id": "correlationid",
    "causation_id": "causationid",
    "schema_version": "schemaversion",
}


def _canonical_uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError(f"not a UUID: {value!r}") from None


EventId = Annotated[str, AfterValidator(_canonical_uuid), Field(json_schema_extra={"format": "uuid"})]


class EventPayload(Model):
    """Base of every event payload; a subclass names its type and the id its subject carries."""

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1

    @property
    @abstractmethod
    def aggregate_id(self) -> str:
        """The `<id>` token of the event's subject."""


P = TypeVar("P", bound=EventPayload)
Q = TypeVar("Q", bound=EventPayload)


def _pin_type(schema: dict[str, Any], model: type[BaseModel]) -> None:
    # Envelope[RunQueued]'s schema then says `type` is exactly "run.queued".
    args = model.__pydantic_generic_metadata__["args"]
    if args:
        schema["properties"]["type"]["const"] = args[0].event_type


class Envelope(Model, Generic[P]):
    """Metadata every event carries, around a typed payload."""

    model_config = ConfigDict(json_schema_extra=_pin_type)

    event_id: EventId = Field(
        default_factory=lambda: str(uuid.uuid4()),
        description="UUID of this event; also the `Nats-Msg-Id` the broker deduplicates on.",
    )
    type: str = Field(description="Event type `<aggregate>.<event>`, e.g. `run.requested`.")
    occurred_at: UtcDatetime = Field(default_factory=utc_now, description="When it happened, in UTC.")
    tenant_id: str = Field(min_length=1, max_length=128, description="Tenant that owns the event.")
    correlation_id: str = Field(
        min_length=1, max_length=128, description="Run, tune-session or head id shared by a whole flow."
    )
    causation_id: EventId | None = Field(None, description="event_id of the event that caused this one.")
    schema_version: int = Field(ge=1, description="Version of the payload schema of this type.")
    producer: str = Field(min_length=1, max_length=128, description="Service that published the event.")
    payload: P = Field(description="Type-specific body.")

    @model_validator(mode="after")
    def _type_matches_payload(self) -> Self:
        expected = self.payload.event_type
        if self.type != expected:
            raise ValueError(f"envelope type {self.type!r} does not match its payload type {expected!r}")
        return self

    @property
    def subject(self) -> str:
        aggregate, event = self.type.split(".", 1)
        return subject(aggregate, self.payload.aggregate_id, event)

    def follow(self, payload: Q, *, producer: str) -> Envelope[Q]:
        """The event this one causes: same tenant and correlation, causation = this event."""
        return new_event(
            payload,
            tenant_id=self.tenant_id,
            correlation_id=self.correlation_id,
            producer=producer,
            causation_id=self.event_id,
        )

    def to_json_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no whitespace): equal events give equal bytes and hashes."""
        body = self.model_dump(mode="json")
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def to_cloudevent(self) -> dict[str, Any]:
        """Structured-mode CloudEvent (JSON format): attributes renamed, payload as `data`."""
        body = self.model_dump(mode="json")
        event = {attr: body[name] for name, attr in CLOUDEVENTS_ATTRIBUTES.items() if body[name] is not None}
        return event | {
            "specversion": CLOUDEVENTS_SPEC_VERSION,
            "subject": self.subject,
            "datacontenttype": "application/json",
            "data": body["payload"],
        }

    @classmethod
    def from_cloudevent(cls, event: Mapping[str, Any]) -> Self:
        if event.get("specversion") != CLOUDEVENTS_SPEC_VERSION:
            raise ValueError(f"unsupported CloudEvents specversion {event.get('specversion')!r}")
        fields = {name: event[attr] for name, attr in CLOUDEVENTS_ATTRIBUTES.items() if attr in event}
        return cls.model_validate(fields | {"payload": event.get("data")})


def new_event(
    payload: Q, *, tenant_id: str, correlation_id: str, producer: str, causation_id: str | None = None
) -> Envelope[Q]:
    """Wrap a payload; type and schema_version come from the payload's class."""
    # Parametrise on the concrete class so serialisation keeps the subclass's fields.
    envelope_cls: Any = Envelope[type(payload)]  # type: ignore[misc]
    return envelope_cls(
        type=payload.event_type,
        tenant_id=tenant_id,
        correlation_id=correlation_id,
        causation_id=causation_id,
        schema_version=payload.schema_version,
        producer=producer,
        payload=payload,
    )


def decode_event(data: bytes | str, types: Mapping[str, type[EventPayload]]) -> Envelope[Any]:
    """An envelope of one of `types` (event type -> payload class); ValueError (incl.
    ValidationError) if the data is not an event of one of them."""
    try:
        raw = loads_json(data)
    except ValueError as exc:
        raise ValueError(f"event is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("event must be a JSON object")
    payload_cls = types.get(str(raw.get("type")))
    if payload_cls is None:
        raise ValueError(f"unknown event type {raw.get('type')!r}; known: {', '.join(types)}")
    version = raw.get("schema_version")
    if isinstance(version, int) and version > payload_cls.schema_version:
        # A newer producer's payload may mean something this consumer's model does not
        # say: reading it as an older version could act on half of it.
        raise ValueError(
            f"{raw['type']} schema version {version} is newer than this service reads "
            f"({payload_cls.schema_version}); upgrade the consumer"
        )
    return Envelope[payload_cls].model_validate(raw)  # type: ignore[valid-type]
