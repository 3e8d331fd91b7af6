"""Path and query parameters every resource shares: spec ids and listing pages."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Query

from specbus.subjects import ID_PATTERN

_SPEC_ID = re.compile(ID_PATTERN)


def is_spec_id(value: str) -> bool:
    """Whether `value` fits the id grammar of runs and tenants (subject tokens); others name nothing."""
    return _SPEC_ID.fullmatch(value) is not None


def nul_pointer(value: Any, pointer: str = "#") -> str | None:
    """JSON Pointer to the first string holding U+0000, which PostgreSQL text and jsonb refuse."""
    if isinstance(value, str):
        return pointer if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        inner = f"{pointer}/{str(name).replace('~', '~0').replace('/', '~1')}"
        found = inner if "\x00" in str(name) else nul_pointer(item, inner)
        if found is not None:
            return found
    return None


# `GET runs` and `GET tune-sessions`: rows per page by default and at most.
PAGE_DEFAULT = 50
PAGE_MAX = 200
T = TypeVar("T")


def next_before(rows: list[T], limit: int, row_id: Callable[[T], str]) -> tuple[list[T], str | None]:
    """A page from up to `limit + 1` rows read: its rows, and the cursor of the next page (the
    id of its last row) when the extra row shows there is one."""
    if len(rows) <= limit:
        return rows, None
    page = rows[:limit]
    return page, row_id(page[-1])


PageLimit = Annotated[int, Query(ge=1, le=PAGE_MAX, description="Most rows in the page (the newest first).")]
Before = Annotated[
    str | None,
    Query(
        pattern=f"^{ID_PATTERN}$",
        description="The previous page's `next_before`: the page starts after that row. Omit for the newest.",
    ),
]


def new_spec_id() -> str:
    """A new run's or tune session's id (a uuid4, which ID_PATTERN accepts)."""
    return str(uuid.uuid4())
