"""The gateway's SQL of uploaded corpora (014_datastores.sql): `datastores`, which it alone writes."""

from __future__ import annotations

from typing import Any

from specbus.envelope import Envelope
from specops_schemas.registry import DatastoreRegistered
from specops_services.gateway.datastores.logic import Usage
from specplatform.db import Connection

_DATASTORE_COLUMNS = "id, name, sha256, size_bytes, format, documents, fingerprints, created_at"


async def insert_datastore(conn: Connection, event: Envelope[DatastoreRegistered]) -> bool:
    """Record a tenant's datastore from its registration event; False if it was there already."""
    ds = event.payload
    cur = await conn.execute(
        """INSERT INTO datastores
               (id, tenant_id, name, sha256, size_bytes, format, documents, fingerprints, path, created_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id""",
        (
            ds.datastore_id,
            event.tenant_id,
            ds.name,
            ds.sha256,
            ds.size_bytes,
            ds.format,
            ds.documents,
            [str(f) for f in ds.fingerprints],
            ds.path,
            event.occurred_at,
        ),
    )
    return await cur.fetchone() is not None


async def find_datastore(conn: Connection, tenant_id: str, datastore_id: str) -> dict[str, Any] | None:
    cur = await conn.execute(
        f"SELECT {_DATASTORE_COLUMNS} FROM datastores WHERE tenant_id = %s AND id = %s",
        (tenant_id, datastore_id),
    )
    row: dict[str, Any] | None = await cur.fetchone()
    return row


async def list_datastores(conn: Connection, tenant_id: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        f"SELECT {_DATASTORE_COLUMNS} FROM datastores WHERE tenant_id = %s ORDER BY created_at DESC, id",
        (tenant_id,),
    )
    return list(await cur.fetchall())


async def lock_tenant(conn: Connection, tenant_id: str) -> None:
    """Serialise the tenant's uploads until the transaction ends, so that two parallel uploads
    cannot both fit in the room only one of them has."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('datastores:' || %s, 0))", (tenant_id,))


async def usage(conn: Connection, tenant_id: str) -> Usage:
    cur = await conn.execute(
        "SELECT coalesce(sum(size_bytes), 0) AS bytes, count(*) AS n FROM datastores WHERE tenant_id = %s",
        (tenant_id,),
    )
    row = await cur.fetchone()
    return Usage(bytes=int(row["bytes"]), datastores=int(row["n"])) if row else Usage(0, 0)
