"""The reaper: fails the runs that made no progress within their stage's deadline.

A run waits on services that may be gone (no predictor running, a benchmark-runner
scaled to zero, a message lost to an outage): nothing else would ever end it, and its
SSE stream would stay open. The gateway reaps, because it holds every run from the
moment it is queued (the predictor knows a run only once it took its request) and
records each of its events with the time it happened (`run_events`).

Every gateway replica runs it. A run is failed in one tenant transaction that locks its
row (`FOR UPDATE SKIP LOCKED`: a row another replica's reaper or the projector holds is
left to them), checks again that it is still stalled, writes the `run.failed` through
the projection (so the run and its stream end at once) and queues it in the outbox: a
run is failed exactly once, and the relay publishes it to the services.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from specbus import outbox
from specbus.envelope import new_event
from specops_services.gateway import results
from specops_services.gateway.runs import db as run_db
from specops_services.gateway.runs import logic as run_logic
from specops_services.gateway.runs import projection
from specplatform.db import Pool, role_transaction, tenant_transaction

log = logging.getLogger(__name__)

REAPED = Counter("specops_runs_reaped_total", "Runs failed for want of progress in a stage.", ["stage"])


async def sweep(pool: Pool, deadlines: Mapping[str, timedelta]) -> list[str]:
    """Fail every stalled run; the ids of those this call failed."""
    async with pool.connection() as conn, role_transaction(conn, run_db.RUN_MONITOR):
        candidates = await run_db.unanswered_runs(conn)
    now = datetime.now(UTC)
    reaped = []
    for progress in candidates:
        if run_logic.stalled(progress, deadlines, now) is not None and await _fail(pool, progress, deadlines):
            reaped.append(progress.run_id)
    return reaped


async def _fail(pool: Pool, seen: run_logic.RunProgress, deadlines: Mapping[str, timedelta]) -> bool:
    async with pool.connection() as conn, tenant_transaction(conn, seen.tenant_id):
        progress = await run_db.lock_unanswered_run(conn, seen.run_id)
        stall = None if progress is None else run_logic.stalled(progress, deadlines, datetime.now(UTC))
        if stall is None:
            return False
        failed = new_event(
            stall.failure(seen.run_id),
            tenant_id=seen.tenant_id,
            correlation_id=seen.run_id,
            producer=results.PRODUCER,
        )
        await projection.apply(conn, failed)
        await results.repeat(conn, failed)
        await outbox.add(conn, failed)
    REAPED.labels(stall.stage).inc()
    log.warning("run %s failed: %s", seen.run_id, failed.payload.message)
    return True


async def run(pool: Pool, deadlines: Mapping[str, timedelta], *, interval_s: float) -> None:
    """Sweep every `interval_s` until cancelled; a failed sweep is logged and tried again."""
    while True:
        try:
            await sweep(pool, deadlines)
        except Exception as exc:
            # Postgres away: the runs wait for the next sweep, nothing is lost.
            log.warning("could not look for stalled runs: %r", exc)
        await asyncio.sleep(interval_s)
