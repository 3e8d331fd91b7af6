"""A service's pool after a Postgres outage: usable again within seconds of the server's
return, however long the outage lasted (the pool's reconnect backoff must not have grown
past that, nor may it hand out a connection that died with the server)."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from fixtures.postgres import OwnPostgres
from psycopg_pool import PoolTimeout

from specplatform.db import create_pool

# Long enough that psycopg_pool's doubling backoff would leave its next try ~50 s out.
OUTAGE_S = 75.0
READY_WITHIN_S = 5.0


async def _query(pool: object) -> bool:
    try:
        async with pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute("SELECT 1")
    except (PoolTimeout, psycopg.OperationalError):
        return False
    return True


@pytest.mark.long  # a 75 s outage and the recovery after it
async def test_a_pool_answers_within_5s_of_postgres_returning_from_a_long_outage(
    own_postgres: OwnPostgres,
) -> None:
    async with create_pool(own_postgres.url, min_size=2, max_size=4, timeout_s=1.0) as pool:
        assert await _query(pool)
        await asyncio.to_thread(own_postgres.stop)
        # Requests keep arriving through the outage, as a gateway's do; every one fails.
        down_until = time.monotonic() + OUTAGE_S
        while time.monotonic() < down_until:
            assert not await _query(pool)
            await asyncio.sleep(0.5)
        await asyncio.to_thread(own_postgres.start)
        back_at = time.monotonic()
        while not await _query(pool):
            assert time.monotonic() - back_at < READY_WITHIN_S, "still failing 5 s after Postgres returned"
            await asyncio.sleep(0.2)
        # And it stays usable: no dead connection is handed out afterwards.
        for _ in range(10):
            assert await _query(pool)
        assert time.monotonic() - back_at < READY_WITHIN_S
