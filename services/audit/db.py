"""SQL of the audit log: append one entry, stream the chain out for verification.

The chaining itself (lock, prev_hash, seq, hash, duplicate skip) happens in the
table's insert trigger (schemas/sql/004_audit.sql, 008_audit_role.sql), so every
writer, this service's replicas included, extends one chain and none can write a row
that does not link. Appends run as `WRITER_ROLE`, which may insert and nothing else:
a compromised audit process cannot rewrite or delete what it recorded. Reads of the
chain run as `READER_ROLE` (`snapshot`): the log holds every tenant's events, which row-
level security hides from the services' own role (schemas/sql/018_rls.sql).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import tuple_row

from specops_services.audit.logic import AuditEntry, AuditRow, ChainHead, ChainVerifier, VerifyReport
from specplatform.db import role_transaction

# Rows fetched per round trip while verifying: memory stays flat for any table size.
ITERSIZE = 2000
# May INSERT into audit_log (and read it), nothing else (schemas/sql/008_audit_role.sql).
WRITER_ROLE = "specops_audit_writer"
# May read audit_log and its chain head, every tenant's rows and tenant-less ones (018_rls.sql).
READER_ROLE = "specops_audit_reader"

_APPEND = """
    INSERT INTO audit_log (event_id, subject, type, tenant_id, payload, stream_seq)
    VALUES (%s, %s, %s, %s, %s, %s)
    RETURNING seq
"""
_ROWS = """
    SELECT seq, event_id, subject, type, tenant_id, payload, stream_seq, recorded_at, prev_hash, hash
    FROM audit_log WHERE seq > %s ORDER BY seq
"""
_HEAD = "SELECT seq, hash FROM audit_chain_head"


async def append(conn: AsyncConnection[Any], entry: AuditEntry) -> int | None:
    """Record `entry`; its seq, or None when its stream message is already in the log (a redelivery).

    An entry without a stream sequence is a duplicate by its event_id instead.
    """
    params = (
        uuid.UUID(entry.event_id),
        entry.subject,
        entry.type,
        entry.tenant_id,
        entry.payload,
        entry.stream_seq,
    )
    async with role_transaction(conn, WRITER_ROLE), conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(_APPEND, params)
        row = await cur.fetchone()
    return None if row is None else int(row[0])


async def read_head(conn: AsyncConnection[Any]) -> ChainHead | None:
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(_HEAD)
        row = await cur.fetchone()
    return None if row is None else ChainHead(int(row[0]), bytes(row[1]))


async def iter_rows(conn: AsyncConnection[Any], *, after_seq: int = 0) -> AsyncIterator[AuditRow]:
    """Rows with seq > `after_seq` in seq order, through a server-side cursor.

    Call it inside a transaction (a named cursor lives in one).
    """
    async with conn.cursor("audit_rows", row_factory=tuple_row) as cur:
        cur.itersize = ITERSIZE
        await cur.execute(_ROWS, (after_seq,))
        async for seq, event_id, subject, type_, tenant, payload, stream_seq, at, prev, hash_ in cur:
            yield AuditRow(
                int(seq), str(event_id), subject, type_, tenant, bytes(payload), stream_seq, at,
                bytes(prev), bytes(hash_),
            )  # fmt: skip


async def verify(conn: AsyncConnection[Any]) -> VerifyReport:
    """Check the whole chain and its head, read in one snapshot so appends meanwhile don't count.

    `conn` must not be inside a transaction already: this one sets its isolation level.
    """
    verifier = ChainVerifier()
    async with snapshot(conn):
        head = await read_head(conn)
        async for row in iter_rows(conn):
            if not verifier.feed(row):
                break
    return verifier.report(head, head_missing=head is None)


@asynccontextmanager
async def snapshot(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A read-only transaction of one snapshot, as READER_ROLE: the whole chain, appends
    committed meanwhile left out. `conn` must not be inside a transaction already."""
    async with role_transaction(conn, READER_ROLE):
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
