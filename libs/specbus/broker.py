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

from specbus.subjects import (
    INTAKE_PREFIX,
    INTAKE_STREAM,
    RESULTS_PREFIX,
    RESULTS_STREAM,
    STREAM,
    STREAM_SUBJECTS,
)

log = logging.getLogger(__name__)

# Broker-side dedup on Nats-Msg-Id; the outbox relay relies on it to make a re-send
# after a crash (published, not yet marked) harmless. Beyond it the consumers' inbox does.
DUPLICATE_WINDOW_S = 120.0
# Every stream is bounded in age and in size. At either limit it discards its OLDEST
# messages to store the new one (DiscardPolicy.OLD): a publish never fails for lack of
# room, and what goes is the oldest history (dead letters included: they live in SPEC).
# The server reserves each stream's max_bytes in its JetStream store when the stream is
# created, so the three must fit there together: 75% of the disk free at the server's
# start unless its config sets max_file_store; the defaults fit the 10 GiB volume of
# infra/base/nats.yaml. `specops up` and `specops deploy init` take other values from
# the environment (specops.runtime.stream.StreamLimits).
#
# The stream is the event log that audit replays, so it keeps events for a long time:
# a year, or 6 GiB (a few million events, years of runs at the pace of one team).
MAX_AGE_S = 365 * 24 * 3600.0
MAX_BYTES = 6 * 2**30
# Upstream requests and the copies of their runs' events are kept a week: long enough to
# read back after an outage; the record that lasts is SPEC (the gateway re-publishes an
# accepted request there as `run.requested`).
UPSTREAM_MAX_AGE_S = 7 * 24 * 3600.0
UPSTREAM_MAX_BYTES = 512 * 2**20

# SPEC_INTAKE keeps JetStream's Nats-Msg-Id dedup as short as the server allows (100 ms):
# that dedup spans the whole stream, so one tenant publishing another's msg id would have
# the other's request dropped as a duplicate, unanswered. Dedup there is per tenant
# instead, in the gateway, by (tenant, the request's event_id) through its idempotency keys.
INTAKE_DUPLICATE_WINDOW_S = 0.1

RECONNECT_BASE_S = 0.25
RECONNECT_CAP_S = 5.0
# Ping often enough that a half-open TCP connection (server host gone) is noticed in
# about a minute rather than the client default of four.
PING_INTERVAL_S = 20


def stream_config(*, max_age_s: float = MAX_AGE_S, max_bytes: int = MAX_BYTES) -> StreamConfig:
    """The SPEC stream: every `spec.>` event, limits retention, 2-minute dedup window.

    Messages cannot be deleted nor the stream purged: it is the record the audit log
    is checked against (`specops audit verify --against-stream`) and rebuilt from.
    Only its limits retire messages, the oldest first: max_age and max_bytes.
    """
    return StreamConfig(
        name=STREAM,
        description="specops events (spec.<aggregate>.<id>.<event>) and dead letters",
        subjects=[STREAM_SUBJECTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age_s,
        max_bytes=max_bytes,
        duplicate_window=DUPLICATE_WINDOW_S,
        deny_delete=True,
        deny_purge=True,
    )


def upstream_stream_configs(
    *, max_age_s: float = UPSTREAM_MAX_AGE_S, max_bytes: int = UPSTREAM_MAX_BYTES
) -> list[StreamConfig]:
    """SPEC_INTAKE (what tenants publish) and SPEC_RESULTS (what they read back), each
    bounded by `max_age_s` and `max_bytes`. Only the gateway's outbox publishes on
    SPEC_RESULTS, so it keeps the usual dedup window; SPEC_INTAKE the smallest."""
    return [
        StreamConfig(
            name=name,
            description=description,
            subjects=[f"{prefix}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=max_age_s,
            max_bytes=max_bytes,
            duplicate_window=window,
        )
        for name, prefix, description, window in (
            (
                INTAKE_STREAM,
                INTAKE_PREFIX,
                "run requests of upstream systems, one subject per tenant",
                INTAKE_DUPLICATE_WINDOW_S,
            ),
            (
                RESULTS_STREAM,
                RESULTS_PREFIX,
                "each tenant's runs' events and intake rejections",
                DUPLICATE_WINDOW_S,
            ),
        )
    ]


async def ensure_stream(js: JetStreamContext, config: StreamConfig | None = None) -> StreamInfo:
    """Create a stream (SPEC unless `config` says otherwise) if it is missing; an existing
    one is left exactly as it is.

    Several services start at once and the runtime creates the stream too, so losing a
    creation race is expected: the winner's stream is then used as it is.
    """
    config = config or stream_config()
    name = str(config.name)
    try:
        return await js.stream_info(name)
    except NotFoundError:
        pass
    log.info("creating JetStream stream %s on %s", name, ", ".join(config.subjects or ()))
    try:
        return await js.add_stream(config)
    except BadRequestError:
        return await js.stream_info(name)


def reconnect_delay(servers: list[Server], server_info: dict[str, Any]) -> tuple[Server | None, float]:
    """nats-py reconnect hook: exponential backoff with full jitter, capped, never giving up.

    `reconnects` counts failed attempts since the last success, so the delay resets once
    a connection is made; jitter keeps N replicas from reconnecting in lockstep.
    """
    server = min(servers, key=lambda s: s.reconnects)
    ceiling = min(RECONNECT_CAP_S, RECONNECT_BASE_S * 2**server.reconnects)
    return server, random.uniform(RECONNECT_BASE_S, max(RECONNECT_BASE_S, ceiling))


class SpecBroker(NatsBroker):
    """A NatsBroker that declares its streams and durable consumers before binding to them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumer_configs: list[tuple[str, ConsumerConfig]] = []
        self.stream_configs: list[StreamConfig] = [stream_config()]

    def declare_consumer(self, config: ConsumerConfig, *, stream: str = STREAM) -> None:
        """Create or update this durable consumer of `stream` on start.

        FastStream only creates a missing consumer, so without this a changed ack_wait
        or filter (a handler taking a new event type) would never reach a deployed one.
        """
        self.consumer_configs.append((stream, config))

    def declare_streams(self, configs: Sequence[StreamConfig]) -> None:
        """Also create these streams on start if they are missing (SPEC always is)."""
        self.stream_configs.extend(configs)

    async def start(self) -> None:
        await self.connect()
        js = jetstream(self)
        for stream in self.stream_configs:
            await ensure_stream(js, stream)
        for stream_name, config in self.consumer_configs:
            await js.add_consumer(stream_name, config=config)
        await super().start()


def inbox_prefix(service: str) -> str:
    """The reply subjects of `service`'s connections: its NATS user may subscribe to these only."""
    return f"_INBOX.svc.{service}"


def make_broker(servers: str | Sequence[str], *, service: str, **options: Any) -> SpecBroker:
    """The broker a service runs on; `options` pass through to FastStream's NatsBroker
    (credentials among them: `nkeys_seed=PATH` or `user_credentials=PATH`).

    Services must survive a NATS restart, so reconnection never gives up
    (`max_reconnect_attempts=-1`) and backs off (`reconnect_delay`); the first connect
    retries the same way, so a service may start before NATS does. Replies (PubAcks,
    pulled messages) come back on `inbox_prefix(service)`, the only inboxes its NATS user
    may read. Its log records go to the `specbus.nats` logger, which the process's entry
    point configures: FastStream's default would add a handler bound to whatever
    sys.stdout is at connect time (a closed capture stream, under pytest).
    """
    settings: dict[str, Any] = {
        "name": service,
        "logger": logging.getLogger("specbus.nats"),
        "inbox_prefix": inbox_prefix(service),
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
