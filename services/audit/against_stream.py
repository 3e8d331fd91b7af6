"""`specops audit verify --against-stream`: each audit row against the SPEC stream message it records.

The hash chain (`db.verify`) only proves the log is self-consistent: whoever can write
the table can rewrite a row and recompute every later hash with the database's own
`audit_row_hash()` and move the chain head, and the chain verifies. The stream is the
second, independent copy: it denies deletes and purges (specbus.broker.stream_config),
so each row is compared with the message at its `stream_seq`, recorded as the audit
records it (`logic.entry_from_message`), and every message the stream holds, from its
first to its last sequence, without a row is named too: the newest rows deleted with the
chain head moved back leave a self-consistent chain, but not the stream's last sequence.
Rows older than the stream's first message (retired at its age or size
limit) are counted, not checked.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from psycopg import AsyncConnection

from specbus.subjects import STREAM
from specops_services.audit import db
from specops_services.audit.logic import StreamChecker, StreamReport
from specops_services.audit.replay import message_at


async def verify_against_stream(conn: AsyncConnection[Any], nc: Client) -> StreamReport:
    """Check every row, read in one snapshot, against the stream; the first row that differs.

    `conn` must not be inside a transaction already: this one sets its isolation level.
    """
    # Read before the rows: a message the stream retires meanwhile is then one it "holds no
    # more", which the row names, rather than one silently skipped.
    kept = await nc.jetstream().stream_info(STREAM)
    checker = StreamChecker(first_kept_seq=kept.state.first_seq, last_seq=kept.state.last_seq)
    async with db.snapshot(conn):
        async for row in db.iter_rows(conn):
            message = None if row.stream_seq is None else await message_at(nc, row.stream_seq)
            if not checker.feed(row, None if message is None else (message.subject, message.data)):
                break
    return checker.report()
