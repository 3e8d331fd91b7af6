"""What the head-trainer's handler does: find a head trained already, check the request,
train in a worker thread while queueing its progress events, then move the head to its
digest dir and queue `head.trained` (or `head.failed`).

Every event is queued in the outbox in a small transaction of its own, as soon as it
happens (the epoch events from the training thread, through this event loop). The last
one is queued with the request's inbox row, so a redelivered request that failed changes
nothing; one whose head is in the store re-queues the same `head.trained` (same id) and
trains nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from specbus import outbox
from specbus.envelope import Envelope
from specbus.inbox import claim
from speccore.errors import SpecError
from speccore.training.data import check_disjoint
from speccore.training.trainer import EpochReport
from specops_schemas.catalog import ErrorStage
from specops_schemas.heads import HeadRequested
from specops_services.head_trainer import db, logic, store
from specops_services.head_trainer.logic import Failure
from specops_services.head_trainer.training import HeadTrainer
from specplatform.db import Pool

log = logging.getLogger(__name__)

T = TypeVar("T")


async def handle(pool: Pool, inbox: str, trainer: HeadTrainer, event: Envelope[HeadRequested]) -> None:
    """Train the requested head unless it is trained or failed already, then queue its last event."""
    head_id = event.payload.head_id
    if await asyncio.to_thread(store.trained_head, trainer.root, event.tenant_id, head_id) is not None:
        log.info("head %s is trained already; its head.trained is queued again", head_id)
        await finish(pool, inbox, trainer, event, None)
        return
    async with pool.connection() as conn:
        if await db.processed(conn, inbox, event.event_id):
            log.info("head %s failed already; skipped", head_id)
            return
    result = await train(pool, trainer, event)
    await finish(pool, inbox, trainer, event, result)


async def queue(pool: Pool, event: Envelope[Any]) -> None:
    """Queue one event in the outbox in its own transaction (a derived id queued again is a no-op)."""
    async with pool.connection() as conn, conn.transaction():
        await outbox.add(conn, event)


async def train(pool: Pool, trainer: HeadTrainer, event: Envelope[HeadRequested]) -> Path | Failure:
    """Check the request, then `trainer.train` in a worker thread, queueing each progress event
    on this event loop (committed before training goes on). The loop stays free meanwhile, so
    the bus's heartbeats keep the message for as long as training takes."""
    requested, root = event.payload, trainer.root
    settings = trainer.settings
    try:
        plan = logic.head_plan(
            event, checkpoint_every=settings.head_checkpoint_every, batch_tokens=settings.head_batch_tokens
        )
        data, heldout = await asyncio.to_thread(_data, root, requested)
    except SpecError as err:
        return _failure(event, ErrorStage.VALIDATION, str(err), root)

    loop = asyncio.get_running_loop()
    stopping = threading.Event()

    def publish(follow: Envelope[Any]) -> None:
        asyncio.run_coroutine_threadsafe(queue(pool, follow), loop).result()

    def on_started(resumed_from_step: int | None, hardware: str) -> None:
        log.info(
            "head %s: training %s",
            requested.head_id,
            f"resumed at step {resumed_from_step}" if resumed_from_step is not None else "from the start",
        )
        publish(logic.training_started(event, resumed_from_step, hardware))

    def on_epoch(report: EpochReport) -> None:
        publish(logic.epoch_completed(event, report))

    def run() -> Path | Failure:
        return trainer.train(event, plan, data, heldout, on_started, on_epoch, stopping)

    try:
        result = await _in_daemon_thread(run)
    except asyncio.CancelledError:
        # The thread cannot be interrupted; it stops at its next epoch (or while it waits for
        # the device lock), and a daemon thread never holds the process's exit up: a
        # redelivery resumes from the checkpoint.
        stopping.set()
        raise
    if isinstance(result, Failure):
        return _failure(event, result.error_stage, result.message, root)
    return result


async def finish(
    pool: Pool,
    inbox: str,
    trainer: HeadTrainer,
    event: Envelope[HeadRequested],
    result: Path | Failure | None,
) -> None:
    """Move a trained head to its digest dir and queue `head.trained` (None: it is there already),
    or queue `head.failed`; with the request's inbox row, in one transaction."""
    root, tenant, head_id = trainer.root, event.tenant_id, event.payload.head_id
    if isinstance(result, Failure):
        last = logic.failed(event, result)
    else:
        directory = (
            await asyncio.to_thread(store.move_to_digest_dir, root, tenant, result)
            if result is not None
            else await asyncio.to_thread(store.trained_head, root, tenant, head_id)
        )
        if directory is None:
            raise RuntimeError(f"head {head_id}: its artifact vanished from the store")
        artifact, config = await asyncio.to_thread(store.describe, root, directory)
        last = logic.trained(event, artifact, config)
    async with pool.connection() as conn, conn.transaction():
        await claim(conn, inbox, event.event_id)
        await outbox.add(conn, last)
    if isinstance(result, Failure):
        log.error("head %s failed at %s: %s", head_id, result.error_stage, result.message)
    else:
        log.info("head %s trained: %s", head_id, last.payload.artifact.path)  # type: ignore[attr-defined]


def _data(root: Path, requested: HeadRequested) -> tuple[Path, Path | None]:
    data = store.data_file(root, requested.train_path)
    store.check_examples(data, requested.train_path)
    heldout = None
    if requested.heldout_path is not None:
        heldout = store.data_file(root, requested.heldout_path)
        store.check_examples(heldout, requested.heldout_path)
        check_disjoint(data, heldout)
    return data, heldout


def _failure(event: Envelope[HeadRequested], stage: ErrorStage, message: str, root: Path) -> Failure:
    """The failure, its message without the store's absolute location (it is shown to the client)."""
    for prefix in {str(root.resolve()), str(root)}:
        message = message.replace(prefix + "/", "")
    return Failure(stage, message)


async def _in_daemon_thread(fn: Callable[[], T]) -> T:
    """`fn()` in a daemon thread: unlike asyncio.to_thread, it never delays the process's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def target() -> None:
        try:
            value = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            _settle_soon(loop, settle, None, err)
        else:
            _settle_soon(loop, settle, value, None)

    threading.Thread(target=target, name="head-training", daemon=True).start()
    return await done


def _settle_soon(loop: asyncio.AbstractEventLoop, settle: Callable[..., None], *args: Any) -> None:
    # A closed loop: the process is shutting down, and nobody waits for the result.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, *args)
