"""The reliable bus every service uses.

- `make_broker` / `ensure_stream`: a FastStream NATS broker that reconnects forever and
  the SPEC stream it binds to.
- `publish`: one event to JetStream with `Nats-Msg-Id = event_id`, waiting for the PubAck.
- `subscriber`: a typed handler on a durable pull consumer, retried with backoff,
  parked on `spec.dlq.<service>` when it keeps failing or the message is malformed.
- `dead_letter_subscriber`: the same for a handler of the parked messages (`spec.dlq.>`).
- `raw_subscriber`: the same for a handler of undecoded messages (`RawMessage`), which
  with `RetryPolicy(max_deliver=None)` is retried forever and never parks.
- `process_once` / `inbox.claim`: side effects once per consumer and event, in a
  transaction acting for the event's tenant (`tenancy.act_for`);
  `process_once_queued` also answers the types of the events it queued, and
  `process_once_logged` logs them (a service's one line per handled event).
- `outbox.add` / `OutboxRelay`: events committed with the state that caused them.
- `tracing`: every publish a `send <subject template>` span, every handler a `process
  <subject template>` span, the trace context carried in the NATS headers.
- `tasks.cancel_until_done`: background tasks stopped for good, cancelled again where a
  cancel was lost.
"""

from typing import NoReturn

# The SDK and the CLI import `specbus.envelope` in the core install, which has no bus or
# database clients (FastStream, psycopg: the services extra). There the bus's names fail
# where they are used, with the missing module, instead of at the envelope's import.
try:
    from specbus import inbox, outbox, tenancy
    from specbus.broker import SpecBroker, ensure_stream, jetstream, make_broker, stream_config
    from specbus.consumer import (
        RawMessage,
        RetryPolicy,
        Unprocessable,
        consumer_name,
        dead_letter_subscriber,
        raw_subscriber,
        subscriber,
    )
    from specbus.dlq import park
    from specbus.inbox import process_once, process_once_logged, process_once_queued
    from specbus.outbox import OutboxRelay
    from specbus.publish import envelope_headers, publish
except ModuleNotFoundError as missing:
    _missing = missing

    def __getattr__(name: str) -> NoReturn:
        raise ModuleNotFoundError(str(_missing), name=_missing.name) from _missing


__all__ = [
    "OutboxRelay",
    "RawMessage",
    "RetryPolicy",
    "SpecBroker",
    "Unprocessable",
    "consumer_name",
    "dead_letter_subscriber",
    "ensure_stream",
    "envelope_headers",
    "inbox",
    "jetstream",
    "make_broker",
    "outbox",
    "park",
    "process_once",
    "process_once_logged",
    "process_once_queued",
    "publish",
    "raw_subscriber",
    "stream_config",
    "subscriber",
    "tenancy",
]
