"""The audit service: every message on `spec.>` into the hash-chained audit log (F-S4).

It does not use `specbus.subscriber`, which decodes typed events and parks what does
not parse: the audit must keep exactly those messages too. Its one durable consumer on
`spec.>` therefore takes raw messages (events, dead letters on `spec.dlq.>`, malformed
ones; see `logic.entry_from_message`) and never parks anything: when the database is
down it naks with backoff for as long as it takes. Parking would send the message to
`spec.dlq.audit`, back into the same failing sink, and the stream keeps every message
for a year, so waiting loses nothing. Replicas share the consumer; the table's trigger
keeps them on one chain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import psycopg
from faststream import AckPolicy, FastStream
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig
from psycopg_pool import PoolTimeout

from specbus import consumer_name, make_broker
from specbus.subjects import STREAM, STREAM_SUBJECTS
from specops_schemas import MIGRATIONS
from specops_services.audit import db
from specops_services.audit.logic import entry_from_message
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings, load_settings

log = logging.getLogger(__name__)

SERVICE = "audit"
DURABLE = consumer_name(SERVICE, "record")
ACK_WAIT_S = 30.0
# Delay before redelivery after the n-th failed attempt to record (the last repeats).
BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 30.0)


def subscribe(
    broker: NatsBroker, pool: Pool, *, durable: str = DURABLE, fetch_timeout_s: float = 5.0
) -> None:
    """Register the recorder on `broker`; it appends through connections from `pool`."""

    async def record(message: NatsMessage) -> None:
        msg = message.raw_message
        entry = entry_from_message(msg.subject, msg.data, msg.metadata.sequence.stream)
        try:
            async with pool.connection() as conn:
                seq = await db.append(conn, entry)
        except (psycopg.Error, PoolTimeout) as exc:
            attempt = msg.metadata.num_delivered
            delay = BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1]
            log.warning(
                "could not record %s (attempt %d), retry in %.0fs: %s", msg.subject, attempt, delay, exc
            )
            await _settle(msg.nak(delay=delay))
            return
        if seq is None:
            log.info("%s %s already recorded", entry.type, entry.event_id)
        await _settle(msg.ack_sync())

    record.__name__ = record.__qualname__ = durable
    broker.subscriber(
        STREAM_SUBJECTS,
        stream=JStream(STREAM, declare=False),
        durable=durable,
        # max_deliver unlimited: see the module docstring.
        config=ConsumerConfig(durable_name=durable, ack_wait=ACK_WAIT_S, max_deliver=-1),
        # One message per fetch: FastStream runs the messages of a fetched batch
        # concurrently, which would record them out of stream order.
        pull_sub=PullSub(batch_size=1, timeout=fetch_timeout_s),
        ack_policy=AckPolicy.MANUAL,
        max_workers=1,
        no_reply=True,
    )(record)


async def _settle(ack: Awaitable[Any]) -> None:
    # A lost ack means a redelivery, which the duplicate skip absorbs.
    try:
        await ack
    except (NatsError, OSError) as exc:
        log.warning("could not settle a message: %r", exc)


def create_app(settings: Settings | None = None) -> FastStream:
    """The audit service process (`specops serve audit`)."""
    settings = settings if settings is not None else load_settings()
    dsn = settings.require_database_url()
    broker = make_broker(settings.require_nats_url(), service=SERVICE)
    pool = create_pool(dsn, min_size=1, max_size=2, name=SERVICE)
    subscribe(broker, pool)
    return service_app(broker, pool, dsn, migrations=MIGRATIONS, outbox=False)


def serve(settings: Settings | None = None) -> None:
    """`specops serve audit`: run until SIGINT / SIGTERM, then stop cleanly."""
    asyncio.run(create_app(settings).run())
