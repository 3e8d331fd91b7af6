"""The one model base (the bus's wire model) and the small annotated types every schema module shares."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from specbus.subjects import ID_PATTERN
from specbus.wire import Model, UtcDatetime, utc_now

# Ids travel as subject tokens, so they obey the subject id grammar.
Id = Annotated[str, Field(pattern=f"^{ID_PATTERN}$")]

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]

# Seeds feed numpy's and torch's generators, which take 32-bit seeds.
MAX_SEED = 2**32 - 1

__all__ = ["MAX_SEED", "Fraction", "Id", "Model", "UtcDatetime", "utc_now"]
