"""Stopping background tasks (specbus.tasks): a lost cancel does not leave a stop waiting forever."""

from __future__ import annotations

import asyncio

from specbus.tasks import cancel_until_done


async def test_a_task_that_swallows_its_first_cancel_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0

    async def loses_one_cancel() -> None:
        # As a task does whose cancel `asyncio.wait_for` swallowed on Python 3.11: it goes on.
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    stubborn = asyncio.create_task(loses_one_cancel())
    plain = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done([stubborn, plain], retry_s=0.05), timeout=10)
    assert stubborn.cancelled() and plain.cancelled()
    assert swallowed == 1


async def test_tasks_already_done_are_left_as_they_ended() -> None:
    done = asyncio.create_task(asyncio.sleep(0, result="kept"))
    await done
    await cancel_until_done([done])
    assert done.result() == "kept"
