"""The audit service: every message on `spec.>` into the hash-chained audit log (F-S4).

Its one durable consumer, `<service>-record` on `spec.>`, is a `specbus.raw_subscriber`:
the handler takes raw messages (events, dead letters on `spec.dlq.>`, malformed ones;
see `logic.entry_from_message`), since the audit must keep exactly the messages a typed
subscriber would park. It never parks anything either (`max_deliver=None`): while the
database is down it retries for as long as it takes (specbus retries an outage within the
delivery, and naks any other failure with backoff). Parking would send the
message to `spec.dlq.audit`, back into the same failing sink, and the stream keeps
every message for a year, so waiting loses nothing. Replicas share the consumer; the
table's trigger keeps them on one chain.
"""

from __future__ import annotations

import asyncio

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RawMessage, RetryPolicy, make_broker, raw_subscriber
from specops_schemas import MIGRATIONS
from specops_services.audit import steps
from specops_services.audit.settings import audit_settings
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

SERVICE = "audit"
# Never parked (see above); the backoff's last delay repeats for as long as recording fails.
RETRY = RetryPolicy(max_deliver=None, backoff_s=(1.0, 2.0, 5.0, 15.0, 30.0), ack_wait_s=30.0)


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    *,
    service: str = SERVICE,
    retry: RetryPolicy = RETRY,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the recorder on `broker`; it appends through connections from `pool`."""

    # One worker: with raw_subscriber's one message per fetch, the log follows stream order.
    @raw_subscriber(
        broker, service=service, name="record", retry=retry, max_workers=1, fetch_timeout_s=fetch_timeout_s
    )
    async def record(message: RawMessage) -> None:
        """Append every `spec.>` message to the audit log, in stream order."""
        await steps.record(pool, message)


def create_app(settings: Settings | None = None) -> FastStream:
    """The audit service process (`specops serve audit`)."""
    config = audit_settings(settings)
    dsn = config.require_database_url()
    broker = make_broker(config.require_nats_url(), service=SERVICE, **config.nats_credentials())
    pool = create_pool(dsn, min_size=1, max_size=config.audit_pool_size, name=SERVICE)
    subscribe(broker, pool)
    return service_app(broker, pool, dsn, migrations=MIGRATIONS, outbox=False)


def serve(settings: Settings | None = None) -> None:
    """`specops serve audit`: run until SIGINT / SIGTERM, then stop cleanly."""
    asyncio.run(create_app(settings).run())
