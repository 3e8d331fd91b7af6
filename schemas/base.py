"""The one model base and the small annotated types every schema module shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from specops_schemas.subjects import ID_PATTERN


class Model(BaseModel):
    """Base of every wire model.

    Unknown fields are rejected rather than dropped: on a request they are a user's
    typo, on an event a producer/consumer mismatch that must reach the dead-letter
    subject instead of being half-processed. Changing a payload bumps its
    ``schema_version``. NaN/inf are refused because events are hashed as JSON.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def utc_now() -> datetime:
    return datetime.now(UTC)


# Naive datetimes are refused: a timestamp without an offset is ambiguous in an audit log.
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]

# Ids travel as subject tokens, so they obey the subject id grammar.
Id = Annotated[str, Field(pattern=f"^{ID_PATTERN}$")]

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
