"""The head-trainer service: `head.requested` in; `head.training_started`, `head.epoch_completed`
per epoch, then `head.trained` (or `head.failed`).

A head trains in its work dir in the artifact store (`heads/<tenant>/work/<head_id>/`),
checkpointed every `SPECOPS_HEAD_CHECKPOINT_EVERY` steps and at each epoch's end. A
trainer killed mid-run loses its lease on the message (no heartbeat for
`head_ack_wait_s`); JetStream redelivers it, and the next delivery resumes from the
checkpoint and ends with the weights of an uninterrupted run; the epochs it reports again
carry the ids they had (steps.py, logic.py), so none is published twice. The trained head
is moved to `heads/<tenant>/<digest>/` and announced with `head.trained`.

A head that cannot be trained (bad data, a plan the trainer refuses, a target that does
not load) fails at once with `head.failed`: the same request would fail the same way.
Anything else that breaks (database, NATS) is retried with backoff, then parked on
`spec.dlq.head_trainer`.
"""

from __future__ import annotations

import asyncio

from faststream import FastStream
from faststream.nats import NatsBroker

from specbus import RetryPolicy, consumer_name, make_broker, subscriber
from specbus.envelope import Envelope
from speccore.model_cache import ModelCache
from specops_schemas import MIGRATIONS
from specops_schemas.heads import HeadRequested
from specops_services.head_trainer import logic, steps
from specops_services.head_trainer.settings import trainer_settings
from specops_services.head_trainer.training import HeadTrainer
from specplatform.db import Pool, create_pool
from specplatform.service import service_app
from specplatform.settings import Settings

SERVICE = "head_trainer"
HANDLER = "train_head"


def retry_policy(ack_wait_s: float) -> RetryPolicy:
    """Backoff that rides out a database or NATS outage of a few minutes before parking."""
    return RetryPolicy(max_deliver=5, backoff_s=(1.0, 5.0, 30.0, 120.0), ack_wait_s=ack_wait_s)


def subscribe(
    broker: NatsBroker,
    pool: Pool,
    trainer: HeadTrainer,
    *,
    service: str = SERVICE,
    retry: RetryPolicy | None = None,
    fetch_timeout_s: float = 5.0,
) -> None:
    """Register the trainer's handler on `broker` (durable consumer `<service>-train_head`)."""
    inbox = consumer_name(service, HANDLER)
    policy = retry or retry_policy(trainer.settings.head_ack_wait_s)

    @subscriber(
        broker,
        service=service,
        events=HeadRequested,
        name=HANDLER,
        retry=policy,
        fetch_timeout_s=fetch_timeout_s,
    )
    async def train_head(event: Envelope[HeadRequested]) -> None:
        """Train the head (or resume it from its checkpoint), then announce it."""
        await steps.handle(pool, inbox, trainer, event)


def create_app(settings: Settings | None = None, *, models: ModelCache | None = None) -> FastStream:
    """The head-trainer process: its consumer, its outbox relay, a target kept loaded."""
    head_settings = trainer_settings(settings)
    dsn = head_settings.require_database_url()
    broker = make_broker(
        head_settings.require_nats_url(), service=SERVICE, **head_settings.nats_credentials()
    )
    pool = create_pool(dsn, min_size=1, max_size=4, name=SERVICE)
    subscribe(broker, pool, HeadTrainer(head_settings, models))
    return service_app(broker, pool, dsn, migrations=MIGRATIONS, producer=logic.PRODUCER)


def serve(settings: Settings | None = None) -> None:
    """`specops serve head-trainer`: run until SIGINT / SIGTERM."""
    asyncio.run(create_app(settings).run())
