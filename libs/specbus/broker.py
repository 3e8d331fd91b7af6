"""A service's connection to NATS: reconnect policy, the SPEC stream, JetStream access."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

from faststream.nats import NatsBroker
from nats.aio.client import Server
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.errors import BadRequestError, NotFoundError

from specbus.subjects import STREAM, STREAM_SUBJECTS

log = logging.getLogger(__name__)

# Broker-side dedup on Nats-Msg-Id; the outbox relay relies on it to make a re-send
# after a crash (published, not yet marked) harmless. Beyond it the consumers' inbox does.
DUPLICATE_WINDOW_S = 120.0
# The stream is the event log that audit replays, so it keeps events for a long time.
MAX_AGE_S = 365 * 24 * 3600.0

RECONNECT_BASE_S = 0.25
RECONNECT_CAP_S = 5.0
# Ping often enough that a half-open TCP connection (server host gone) is noticed in
# about a minute rather than the client default of four.
PING_INTERVAL_S = 20


def stream_config(*, max_age_s: float = MAX_AGE_S) -> StreamConfig:
    """The SPEC stream: every `spec.>` event, limits retention, 2-minute dedup window.

    Messages cannot be deleted nor the stream purged: it is the record the audit log
    is checked against (`specops audit verify --against-stream`) and rebuilt from.
    Only max_age retires messages.
    """
    return StreamConfig(
        name=STREAM,
        description="specops events (spec.<aggregate>.<id>.<event>) and dead letters",
        subjects=[STREAM_SUBJECTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age_s,
        duplicate_window=DUPLICATE_WINDOW_S,
        deny_delete=True,
        deny_purge=True,
    )


async def ensure_stream(js: JetStreamContext, *, max_age_s: float = MAX_AGE_S) -> StreamInfo:
    """Create the SPEC stream if it is missing; an existing one is left exactly as it is.

    Several services start at once and the runtime creates the stream too, so losing a
    creation race is expected: the winner's stream is then used as it is.
    """
    try:
        return await js.stream_info(STREAM)
    except NotFoundError:
        pass
    log.info("creating JetStream stream %s on %s", STREAM, STREAM_SUBJECTS)
    try:
        return await js.add_stream(stream_config(max_age_s=max_age_s))
    except BadRequestError:
        return await js.stream_info(STREAM)


def reconnect_delay(servers: list[Server], server_info: dict[str, Any]) -> tuple[Server | None, float]:
    """nats-py reconnect hook: exponential backoff with full jitter, capped, never giving up.

    `reconnects` counts failed attempts since the last success, so the delay resets once
    a connection is made; jitter keeps N replicas from reconnecting in lockstep.
    """
    server = min(servers, key=lambda s: s.reconnects)
    ceiling = min(RECONNECT_CAP_S, RECONNECT_BASE_S * 2**server.reconnects)
    return server, random.uniform(RECONNECT_BASE_S, max(RECONNECT_BASE_S, ceiling))


class SpecBroker(NatsBroker):
    """A NatsBroker that declares the SPEC stream and its durable consumers before binding to them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumer_configs: list[ConsumerConfig] = []

    def declare_consumer(self, config: ConsumerConfig) -> None:
        """Create or update this durable consumer on start.

        FastStream only creates a missing consumer, so without this a changed ack_wait
        or filter (a handler taking a new event type) would never reach a deployed one.
        """
        self.consumer_configs.append(config)

    async def start(self) -> None:
        await self.connect()
        js = jetstream(self)
        await ensure_stream(js)
        for config in self.consumer_configs:
            await js.add_consumer(STREAM, config=config)
        await super().start()


def make_broker(servers: str | Sequence[str], *, service: str, **options: Any) -> SpecBroker:
    """The broker a service runs on; `options` pass through to FastStream's NatsBroker.

    Services must survive a NATS restart, so reconnection never gives up
    (`max_reconnect_attempts=-1`) and backs off (`reconnect_delay`); the first connect
    retries the same way, so a service may start before NATS does.
    """
    settings: dict[str, Any] = {
        "name": service,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "reconnect_to_server_handler": reconnect_delay,
        "ping_interval": PING_INTERVAL_S,
        "max_outstanding_pings": 3,
    }
    return SpecBroker(servers, **(settings | options))


def jetstream(target: NatsBroker | JetStreamContext) -> JetStreamContext:
    """The JetStream context of a connected broker (or the context itself)."""
    if isinstance(target, JetStreamContext):
        return target
    return target.config.connection_state.stream
