"""Stopping a service's background tasks for good."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

# How long a cancelled task gets to end before it is cancelled again.
STOP_RETRY_S = 0.5


async def cancel_until_done(tasks: Sequence[asyncio.Task[Any]], *, retry_s: float = STOP_RETRY_S) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again each `retry_s`.

    A single cancel can be lost: on Python 3.11 `asyncio.wait_for`, which nats-py's requests
    and psycopg_pool's waits use, can swallow one that arrives as its wait ends (CPython
    gh-86296). The outbox relay then carried on, and whoever awaited it hung: the test
    suite, once, for the rest of CI's time.
    """
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=retry_s)
