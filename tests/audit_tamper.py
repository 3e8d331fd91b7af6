"""Tampering with the audit log as an attacker with the table owner's rights would (tests only)."""

from __future__ import annotations

import psycopg


def rewrite_with_recomputed_chain(dsn: str, seq: int, payload: bytes) -> None:
    """What an attacker with the table owner's rights does: change one row's payload, then
    recompute every hash from there with the database's own audit_row_hash() and move the head."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")  # the append-only triggers off
        conn.execute("UPDATE audit_log SET payload = %s WHERE seq = %s", (payload, seq))
        _relink_from(conn, seq)


def delete_with_recomputed_chain(dsn: str, seq: int) -> None:
    """Delete one row (the newest, or one in the middle), relink the rows after it and move
    the chain head back onto the last row left: the chain alone verifies again."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("DELETE FROM audit_log WHERE seq = %s", (seq,))
        _relink_from(conn, seq)


def _relink_from(conn: psycopg.Connection[tuple[object, ...]], seq: int) -> None:
    rows = conn.execute("SELECT seq FROM audit_log WHERE seq >= %s ORDER BY seq", (seq,)).fetchall()
    for (current,) in rows:
        conn.execute(
            """UPDATE audit_log SET
                   prev_hash = coalesce((SELECT hash FROM audit_log WHERE seq < %(s)s ORDER BY seq DESC
                                         LIMIT 1), %(genesis)s)
               WHERE seq = %(s)s""",
            {"s": current, "genesis": bytes(32)},
        )
        conn.execute(
            """UPDATE audit_log SET hash = audit_row_hash(prev_hash, seq, event_id, subject, type,
                   tenant_id, stream_seq, recorded_at, payload) WHERE seq = %s""",
            (current,),
        )
    conn.execute(
        "UPDATE audit_chain_head SET seq = last.seq, hash = last.hash "
        "FROM (SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1) last"
    )
