"""An event stream as server-sent events: a run's, a tune session's — any feed of numbered events.

A *feed* is one stream in the database: `read(conn, after)` returns whether the stream
has ended (its resource is gone, or its status is terminal) and its events after seq
`after`; `terminal_types` are the event types that end it. :func:`follow` turns it into
SSE — ids are the seqs, so `Last-Event-ID` resumes — woken by the LISTEN notifications
of new events (`listener`), with keepalive comments and a periodic check that the
caller's token is still live.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

import psycopg
from fastapi import Header, Request
from fastapi.sse import ServerSentEvent

from specops_schemas.api import Problem
from specops_services.gateway import db
from specops_services.gateway.http import db as http_db
from specops_services.gateway.http.auth import Principal, pool_of
from specops_services.gateway.http.listener import RunEventsListener
from specops_services.gateway.http.problems import first_line, problem
from specplatform.db import Connection, Pool, role_transaction, tenant_transaction

log = logging.getLogger(__name__)

# An event stream's last event when it cannot go on (its data: a problem), and the problem
# of a token revoked while its stream was open.
SSE_ERROR = "error"
TOKEN_REVOKED = "urn:specops:problem:token-revoked"

# (ended, events after the given seq): `ended` is read first, so once it says so the
# events read after it are sure to include the terminal one.
Read = Callable[[Connection, int], Awaitable[tuple[bool, list[db.EventRow]]]]


@dataclass(frozen=True, slots=True)
class Feed:
    stream_id: str
    """The run or session id: what the listener is woken with."""
    location: str
    """URL path of the resource the stream belongs to."""
    read: Read
    terminal_types: frozenset[str]


async def follow(
    pool: Pool,
    listener: RunEventsListener | None,
    principal: Principal,
    feed: Feed,
    after: int,
    *,
    poll_s: float,
    keepalive_s: float,
    token_check_s: float,
) -> AsyncIterator[ServerSentEvent]:
    """The feed's events after seq `after`, as they land, until its terminal event.

    A stream may stay open for as long as its run or session takes: every `token_check_s`
    it checks that its caller's token (through the console: its session) is still live, and
    once it is revoked (signed out, expired) the stream ends with an `error` event holding
    the 401 problem.
    """
    last_sent = token_checked = time.monotonic()
    while True:
        if time.monotonic() - token_checked >= token_check_s:
            live = await _caller_live(pool, principal)
            if not live:
                yield token_revoked(feed.location)
                return
            token_checked = time.monotonic()
        async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
            ended, rows = await feed.read(conn, after)
        for event in rows:
            yield ServerSentEvent(id=str(event.seq), event=event.type, raw_data=event.data)
            after = event.seq
            last_sent = time.monotonic()
            if event.type in feed.terminal_types:
                return
        if rows:
            continue
        # Resumed after the terminal event, or the resource vanished: nothing more will come.
        if ended:
            return
        if time.monotonic() - last_sent >= keepalive_s:
            yield ServerSentEvent(comment="keepalive")
            last_sent = time.monotonic()
        if listener is not None:
            await listener.wait(feed.stream_id, timeout=poll_s)
        else:
            await asyncio.sleep(poll_s)


def token_revoked(location: str) -> ServerSentEvent:
    """The last event of a stream whose token was revoked (or console session ended) while open."""
    body = Problem(
        type=TOKEN_REVOKED,
        title="Unauthorized",
        status=401,
        detail="the token was revoked (or the console session ended) while the stream was open",
        instance=f"{location}/events",
    )
    return ServerSentEvent(event=SSE_ERROR, raw_data=body.model_dump_json(exclude_none=True))


def parse_last_event_id(value: str | None) -> int:
    """The sequence a client resumes after; ids are the per-run `run_events.seq` we sent."""
    if value is None or not value.strip():
        return 0
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ValueError("Last-Event-ID must be an event id this stream sent (a non-negative integer)")
    return int(text)


LAST_EVENT_ID_DOC = "The `id` of the last event received; the stream resumes after it."


def resume_after(
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description=LAST_EVENT_ID_DOC)] = None,
) -> int:
    """The event sequence a stream resumes after (Last-Event-ID); 400 if it is malformed."""
    try:
        return parse_last_event_id(last_event_id)
    except ValueError as exc:
        raise problem(400, str(exc)) from None


async def _caller_live(pool: Pool, principal: Principal) -> bool:
    if principal.session_sha256 is not None:
        async with pool.connection() as conn, role_transaction(conn, http_db.SESSION_KEEPER):
            return await http_db.session_live(conn, principal.session_sha256)
    async with pool.connection() as conn, role_transaction(conn, http_db.TOKEN_READER):
        return await http_db.token_live(conn, principal.token_id)


async def follow_feed(
    request: Request, principal: Principal, feed: Feed, after: int, what: str
) -> AsyncIterator[ServerSentEvent]:
    """`follow` under the app's SSE settings; a database outage ends the stream (logged as `what`'s)."""
    settings = request.app.state.settings
    events = follow(
        pool_of(request),
        request.app.state.listener,
        principal,
        feed,
        after,
        poll_s=settings.gateway_sse_poll_s,
        keepalive_s=settings.gateway_sse_keepalive_s,
        token_check_s=settings.gateway_sse_token_check_s,
    )
    try:
        async for event in events:
            yield event
    except psycopg.OperationalError as exc:
        # The headers are sent, so no 503 now: the stream ends, and the client's reconnection
        # (with Last-Event-ID) gets the 503 until the database is back.
        log.warning("database unavailable: the event stream of %s ends: %s", what, first_line(exc))
