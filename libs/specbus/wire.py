"""The base of every message on the wire and the timestamp type they carry.

Unknown fields are rejected rather than dropped: on a request they are a user's typo,
on an event a producer/consumer mismatch that must reach the dead-letter subject
instead of being half-processed. NaN/inf are refused because events are hashed as
JSON. Naive datetimes are refused: a timestamp without an offset is ambiguous in an
audit log.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict


class Model(BaseModel):
    """Base of every wire model (events, dead letters, HTTP bodies); changing a payload
    bumps its ``schema_version``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def utc_now() -> datetime:
    return datetime.now(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]


def loads_json(data: bytes | str) -> Any:
    """json.loads whose every failure is a ValueError, so callers that treat a malformed
    message as malformed (park it, record it as invalid) cannot miss one.

    Nesting deeper than the interpreter's recursion limit (`[` x 5000) raises
    RecursionError in json.loads, which is not a ValueError: let through, it escaped the
    handlers' malformed-message paths and the message came back forever.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
