"""`specops audit replay --rebuild` and `specops audit diff` under a login that owns the tables
but is no superuser and has no BYPASSRLS: row-level security (FORCE, schemas/sql/018_rls.sql)
binds it, so they read every tenant's rows through specops_rebuild_reader (022_rls_children.sql)
and still see them.

The server is this test's own: a role made by the owner login (the migrations' NOLOGIN roles)
must not exist beforehand, as it does on the session's server, made by its superuser."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import nats
import psycopg
import pytest
from fixtures.postgres import server_tmpdir
from nats.js import JetStreamContext
from psycopg.conninfo import make_conninfo

from specbus import publish
from specbus.envelope import Envelope, new_event
from specops.runtime import postgres_server
from specops.runtime.rebuild import RebuildError, diff, rebuild
from specops_schemas import MIGRATIONS
from specops_schemas.registry import DatastoreRegistered
from specops_services.audit.replay import ReplayStart
from specops_services.gateway.runs import projection as gateway_projection
from specplatform.db import connect, migrate, tenant_transaction, with_database

OWNER = "specops_owner"


@dataclass(frozen=True, slots=True)
class PlainOwner:
    admin: str  # the server's superuser, on the live database
    live: str  # the owner login, on the live database
    rebuilt: str  # the owner login, on a fresh database for the rebuild


@pytest.fixture
def plain_owner() -> Iterator[PlainOwner]:
    """A server whose two databases were migrated by OWNER, which then lost BYPASSRLS: 018
    alters roles' BYPASSRLS, which only a login that has it may do."""
    root = server_tmpdir("specops-test-owner-pg-")
    record = postgres_server.start(root / "pgdata")
    try:
        with psycopg.connect(record.url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {OWNER} LOGIN CREATEROLE BYPASSRLS")
            for name in ("live", "rebuilt"):
                conn.execute(f"CREATE DATABASE {name} OWNER {OWNER}")
        server = PlainOwner(
            admin=with_database(record.url, "live"),
            live=make_conninfo(with_database(record.url, "live"), user=OWNER),
            rebuilt=make_conninfo(with_database(record.url, "rebuilt"), user=OWNER),
        )
        for dsn in (server.live, server.rebuilt):
            asyncio.run(migrate(dsn, MIGRATIONS))
        with psycopg.connect(record.url, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {OWNER} NOBYPASSRLS")
        yield server
    finally:
        postgres_server.stop(record)
        shutil.rmtree(root, ignore_errors=True)


def _registered(tenant: str) -> Envelope[DatastoreRegistered]:
    sha256 = uuid.uuid4().hex * 2
    ds_id = f"ds-{sha256[:24]}"
    payload = DatastoreRegistered(
        datastore_id=ds_id,
        name="corpus",
        sha256=sha256,
        size_bytes=10,
        format="text",
        documents=1,
        fingerprints=["code"],
        path=f"datastores/{tenant}/{sha256}.txt",
    )
    return new_event(payload, tenant_id=tenant, correlation_id=ds_id, producer="gateway")


async def test_rebuild_and_diff_see_every_tenants_rows_under_a_plain_owner_login(
    plain_owner: PlainOwner, nats_url: str, js: JetStreamContext
) -> None:
    events = [_registered("acme"), _registered("globex")]
    first = (await publish(js, events[0])).seq
    await publish(js, events[1])
    async with await connect(plain_owner.live, autocommit=True) as conn:
        for event in events:  # as the gateway wrote them live
            async with tenant_transaction(conn, event.tenant_id):
                await gateway_projection.rebuild(conn, event)
        # The premise: FORCE binds the owner, which sees no row by itself.
        cursor = await conn.execute("SELECT count(*) AS n FROM datastores")
        assert await cursor.fetchone() == {"n": 0}

    nc = await nats.connect(nats_url)
    try:
        report = await rebuild(nc, plain_owner.rebuilt, ReplayStart(seq=first))
        assert (report.events, report.unwritten) == (2, [])
        assert await diff(plain_owner.live, plain_owner.rebuilt) == []

        # The rebuilt database now holds both tenants' rows: it is no rebuild target.
        with pytest.raises(RebuildError, match="its datastores has 2 rows"):
            await rebuild(nc, plain_owner.rebuilt, ReplayStart(seq=first))
    finally:
        await nc.close()

    # A live row changed behind the stream's back: the diff sees it.
    with psycopg.connect(plain_owner.admin, autocommit=True) as conn:
        conn.execute("UPDATE datastores SET name = 'renamed' WHERE tenant_id = 'globex'")
    [found] = await diff(plain_owner.live, plain_owner.rebuilt)
    assert (found.table, found.column, found.live, found.rebuilt) == (
        "datastores",
        "name",
        "renamed",
        "corpus",
    )
