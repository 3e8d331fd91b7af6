"""The security service's steps when replicas (or its two head consumers) handle one tenant's
events at once, on a real PostgreSQL: the first transaction is held open, the second started
and seen waiting on a lock, then the first commits. Each step runs under `process_once`, as
the service's handlers run it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from fixtures import bus

from specbus import process_once
from specbus.envelope import Envelope, new_event
from specops_schemas.heads import HeadEpoch, HeadEpochCompleted
from specops_schemas.security import PolicyChangeRequested, PolicySettings
from specops_services.security import steps
from specplatform.db import Connection, Pool, create_pool

TENANT = "acme"
Step = Callable[[Connection, Any], Awaitable[steps.Events]]


@pytest.fixture
async def pool(db: str) -> AsyncIterator[Pool]:
    async with create_pool(db, max_size=4) as opened:
        yield opened


def _waiting_on_a_lock(db: str) -> bool:
    """Whether some other session of this database waits on a lock (row, transaction or advisory)."""
    query = """SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND wait_event_type = 'Lock'"""
    return bool(bus.sql(db, query))


async def _one_after_the_other(
    db: str, pool: Pool, step: Step, first: Envelope[Any], second: Envelope[Any]
) -> tuple[steps.Events, steps.Events]:
    """`step` for `first` in a transaction held open until `step` for `second` waits on a lock
    (or has finished, where nothing makes it wait); each one's queued events."""
    done: dict[str, steps.Events] = {}
    ran_first, release = asyncio.Event(), asyncio.Event()

    async def held(conn: Connection) -> steps.Events:
        done["first"] = await step(conn, first)
        ran_first.set()
        await release.wait()
        return done["first"]

    async def plain(conn: Connection) -> steps.Events:
        done["second"] = await step(conn, second)
        return done["second"]

    holder = asyncio.create_task(process_once(pool, "security-race", first, held))
    await ran_first.wait()
    follower = asyncio.create_task(process_once(pool, "security-race", second, plain))
    deadline = time.monotonic() + bus.WAIT_S
    while not (_waiting_on_a_lock(db) or follower.done()):
        assert time.monotonic() < deadline, "the second step neither waited nor finished"
        await asyncio.sleep(0.02)
    release.set()
    await asyncio.gather(holder, follower)
    return done["first"], done["second"]


def _requested(budget_s: float) -> Envelope[PolicyChangeRequested]:
    asked = PolicyChangeRequested(
        tenant_id=TENANT,
        settings=PolicySettings(tier="shared", gpu_budget_s=budget_s),
        requested_by="tok-admin",
    )
    return new_event(asked, tenant_id=TENANT, correlation_id=TENANT, producer="gateway")


async def test_two_policy_changes_at_once_become_two_versions(db: str, pool: Pool) -> None:
    first, second = await _one_after_the_other(
        db, pool, steps.policy_requested, _requested(100.0), _requested(200.0)
    )
    assert first[0].payload.policy.version == 1
    assert second[0].payload.policy.version == 2, "the second change is the next version, not a rival 1"
    stored = bus.sql(db, "SELECT version, policy->>'gpu_budget_s' FROM security_policies")
    assert stored == [(2, "200.0")]


def _epoch(head_id: str, elapsed_s: float) -> Envelope[HeadEpochCompleted]:
    point = HeadEpoch(epoch=1, steps=4, tokens_seen=512, train_loss=None, heldout={}, elapsed_s=elapsed_s)
    return new_event(
        HeadEpochCompleted(head_id=head_id, epoch=point),
        tenant_id=TENANT,
        correlation_id=head_id,
        producer="head-trainer",
    )


@pytest.mark.parametrize(("first_s", "second_s"), [(0.6, 0.9), (0.9, 0.6)])
async def test_a_heads_seconds_counted_by_two_consumers_at_once_count_once(
    db: str, pool: Pool, first_s: float, second_s: float
) -> None:
    head = "hd-" + uuid.uuid4().hex[:24]
    await _one_after_the_other(db, pool, steps.head_progress, _epoch(head, first_s), _epoch(head, second_s))
    [(used,)] = bus.sql(db, "SELECT used_s FROM security_usage")
    [(counted,)] = bus.sql(db, "SELECT counted_s FROM security_head_usage")
    assert used == pytest.approx(0.9) and counted == pytest.approx(0.9), "each second once, never backwards"
