"""What the audit does with one bus message: make its entry (logic), append it (db).

The append is its own transaction, and the table's trigger skips a stream sequence
recorded already, so a redelivered message adds nothing and the audit needs no inbox.
The same event published twice is two messages of the stream and two rows: the log is
a copy of the stream, and a forged message reusing a real event's id cannot make the
audit skip that event.
"""

from __future__ import annotations

import logging

from specbus import RawMessage
from specops_services.audit import db, logic
from specplatform.db import Pool

log = logging.getLogger(__name__)


async def record(pool: Pool, message: RawMessage) -> int | None:
    """Append `message` to the audit log; its seq, or None if it was recorded already."""
    entry = logic.entry_from_message(message.subject, message.data, message.stream_sequence)
    async with pool.connection() as conn:
        seq = await db.append(conn, entry)
    if seq is None:
        log.info("%s %s (stream seq %s) already recorded", entry.type, entry.event_id, entry.stream_seq)
    return seq
