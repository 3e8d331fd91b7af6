"""Whose fault a failure is: the infrastructure's (transient) or the message's (permanent).

A handler that failed because Postgres or NATS could not be reached would succeed,
unchanged, once they are back: that failure is *transient*. Counting it toward the
message's deliveries would park every message in flight during an outage longer than
the retry budget, so the consumer retries it without limit instead (`specbus.consumer`)
and the outbox relay stops its batch without blaming the row (`specbus.outbox`).
Anything else is *permanent*: a bug or bad data, which the same message will hit
again, so it is retried a few times and then parked (or quarantined).

Transient, wherever it sits in the exception's chain (`raise ... from`, or raised while
handling one; and every member of an exception group):
- psycopg's OperationalError: no connection, connection lost, server shutting down
  (AdminShutdown), pool timeout (psycopg_pool.PoolTimeout), serialization failure or
  deadlock (TransactionRollbackError), out of disk or connections. Except a cancelled
  statement (QueryCanceled: a statement timeout, which the same work would hit again)
  and a closed pool (PoolClosed: this process is stopping, retrying in it cannot help).
- nats-py's connection errors (closed, stale, reconnecting, draining, no servers,
  outbound buffer full), request timeouts, no responders (JetStream not up yet, or
  not reachable), JetStream's 503/500 answers.
- The standard library's ConnectionError and TimeoutError (asyncio's is the same class).
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
import psycopg
import psycopg.errors
import psycopg_pool

_NATS_TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    # What nats-py's JetStream publish raises for no responders.
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
)
_POSTGRES_PERMANENT = (psycopg.errors.QueryCanceled, psycopg_pool.PoolClosed)


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is, or was caused by, an outage of Postgres or NATS (see the module doc)."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if _infrastructure(current):
            return True
        if isinstance(current, BaseExceptionGroup) and all(map(is_transient, current.exceptions)):
            return True
        pending += [link for link in (current.__cause__, current.__context__) if link is not None]
    return False


def _infrastructure(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError):
        return not isinstance(exc, _POSTGRES_PERMANENT)
    return isinstance(exc, (*_NATS_TRANSIENT, ConnectionError, TimeoutError))


def publish_denied(subject: str, last_error: BaseException | None) -> bool:
    """Whether a NATS connection whose last error is `last_error` was refused publishing on `subject`.

    The server answers a publish its user may not make with an asynchronous
    "Permissions Violation" error on the connection, not on the request: the request
    itself only times out, which alone would read as transient.
    """
    text = str(last_error or "")
    return "Permissions Violation for Publish" in text and f'"{subject}"' in text
