"""The SQL of who is asking: tenants and API tokens (001_core.sql), the console's sessions
(023_console_sessions.sql), and the LISTEN that wakes event streams (003_gateway.sql)."""

from __future__ import annotations

from dataclasses import dataclass

from specops_schemas.catalog import Role
from specplatform.db import Connection, connect

# The narrow cross-tenant roles the gateway takes (schemas/sql/018_rls.sql).
TOKEN_READER = "specops_token_reader"  # live api_tokens, looked up before the tenant is known
# console_sessions by their hash (and their live token), looked up before the tenant is known
SESSION_KEEPER = "specops_session_keeper"


@dataclass(frozen=True, slots=True)
class TokenRow:
    token_id: str
    tenant_id: str
    role: Role


async def find_token(conn: Connection, secret_sha256: str) -> TokenRow | None:
    """The live token with this hash, as TOKEN_READER (the tenant is not known yet)."""
    cur = await conn.execute(
        "SELECT id, tenant_id, role FROM api_tokens WHERE secret_sha256 = %s AND revoked_at IS NULL",
        (secret_sha256,),
    )
    row = await cur.fetchone()
    return None if row is None else TokenRow(row["id"], row["tenant_id"], Role(row["role"]))


async def open_session(
    conn: Connection, *, session_sha256: str, token_id: str, tenant_id: str, max_age_s: float
) -> None:
    """Record a console session of the token (in its tenant's transaction), and drop the
    tenant's sessions that have expired."""
    await conn.execute(
        "DELETE FROM console_sessions WHERE tenant_id = %s AND expires_at <= now()", (tenant_id,)
    )
    await conn.execute(
        """INSERT INTO console_sessions (id_sha256, token_id, tenant_id, expires_at)
           VALUES (%s, %s, %s, now() + make_interval(secs => %s))""",
        (session_sha256, token_id, tenant_id, max_age_s),
    )


async def touch_session(conn: Connection, session_sha256: str, idle_s: float) -> TokenRow | None:
    """The token of a live session (not expired, used within `idle_s`, its token not revoked),
    marking it used now; as SESSION_KEEPER."""
    cur = await conn.execute(
        """UPDATE console_sessions s SET last_seen_at = now()
           FROM api_tokens t
           WHERE s.id_sha256 = %s AND t.id = s.token_id AND t.revoked_at IS NULL
             AND s.expires_at > now() AND s.last_seen_at > now() - make_interval(secs => %s)
           RETURNING t.id, t.tenant_id, t.role""",
        (session_sha256, idle_s),
    )
    row = await cur.fetchone()
    return None if row is None else TokenRow(row["id"], row["tenant_id"], Role(row["role"]))


async def session_live(conn: Connection, session_sha256: str) -> bool:
    """Whether a console session is still there, unexpired, its token live (an open event stream
    re-checks its caller's; the stream itself is the session's use), as SESSION_KEEPER."""
    cur = await conn.execute(
        """SELECT 1 FROM console_sessions s JOIN api_tokens t ON t.id = s.token_id
           WHERE s.id_sha256 = %s AND t.revoked_at IS NULL AND s.expires_at > now()""",
        (session_sha256,),
    )
    return await cur.fetchone() is not None


async def end_session(conn: Connection, session_sha256: str) -> None:
    """Forget a console session (signing out), as SESSION_KEEPER."""
    await conn.execute("DELETE FROM console_sessions WHERE id_sha256 = %s", (session_sha256,))


async def token_live(conn: Connection, token_id: str) -> bool:
    """Whether the token is still there and not revoked (an open event stream re-checks its
    caller's), as TOKEN_READER."""
    cur = await conn.execute("SELECT 1 FROM api_tokens WHERE id = %s AND revoked_at IS NULL", (token_id,))
    return await cur.fetchone() is not None


async def create_token(
    conn: Connection, *, token_id: str, tenant_id: str, role: Role, secret_sha256: str, name: str | None
) -> None:
    """Insert a token, creating its tenant on first use."""
    await ensure_tenant(conn, tenant_id)
    await conn.execute(
        "INSERT INTO api_tokens (id, tenant_id, role, secret_sha256, name) VALUES (%s, %s, %s, %s, %s)",
        (token_id, tenant_id, role.value, secret_sha256, name),
    )


async def tenant_exists(conn: Connection, tenant_id: str) -> bool:
    cur = await conn.execute("SELECT 1 FROM tenants WHERE id = %s", (tenant_id,))
    return await cur.fetchone() is not None


async def ensure_tenant(conn: Connection, tenant_id: str) -> None:
    """Create the tenant unless it exists (named by its id)."""
    await conn.execute(
        "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING", (tenant_id, tenant_id)
    )


RUN_EVENTS_CHANNEL = "run_events"  # pg_notify channel of the trigger in 003_gateway.sql


async def listen_run_events(dsn: str) -> Connection:
    """A dedicated autocommit connection subscribed to run_events notifications."""
    conn = await connect(dsn, autocommit=True)
    await conn.execute(f"LISTEN {RUN_EVENTS_CHANNEL}")
    return conn


async def ping(conn: Connection) -> None:
    await conn.execute("SELECT 1")
