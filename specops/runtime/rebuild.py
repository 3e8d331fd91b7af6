"""`specops audit replay --rebuild --into DSN` and `specops audit diff`: the state, again, from the stream.

The rebuild re-drives the SPEC stream, in stream order, into a fresh database through
each service's own projection, the function that service writes its rows with when it
publishes the event (nothing is measured or predicted again):

- gateway (`gateway.projection`): every event of a run (`run.requested` / `run.queued`
  open it) -> `runs`, `run_events`, `winner_cache`, and the run's `tenants` row (its
  id only: live, a tenant's first token creates it); (`gateway.tune_projection`) every
  event of a tune session (`tune.requested` opens it) -> `tune_sessions`,
  `tune_session_events`, and a completed session's winner -> `winner_cache`;
  `registry.datastore_registered` -> `datastores`; (`gateway.security_projection`)
  `security.policy_changed` / `security.budget_exhausted` -> `gateway_security_policies`,
  `gateway_budget_exhaustions`;
- predictor (`predictor.projection`): `run.predicted` -> `candidates`;
- benchmark-runner (`benchmark_runner.projection`): `bench.rep_measured` -> `bench_results`;
- quality gate (`quality_gate.projection`): `gate.evaluated` -> `gate_results`.

Dead letters, messages that are no event, and events on a subject other than their own
(an upstream request on its intake subject, which the gateway answers with events of
its own) write nothing: no service wrote a row for them as they are. An event that cannot be
written (as it could not live: a `run.predicted` of a run no gateway opened) is
counted and named, and the rebuild goes on. The diff then compares the rebuilt tables
with the live ones (`table_diff`).

Both read every tenant's rows of those tables (the check that --into is fresh, the diff)
as `READER_ROLE`, which may do that and nothing else: row-level security binds the login
these tools run as too unless it is a superuser (schemas/sql/018_rls.sql, 022_rls_children.sql).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from nats.aio.client import Client
from psycopg import sql

from specbus.envelope import Envelope
from specops.runtime.table_diff import TABLES, Difference, TableSpec, diff_rows
from specops_schemas import MIGRATIONS
from specops_schemas.events import parse_event
from specops_services.audit.replay import ReplayStart, messages
from specops_services.benchmark_runner import projection as bench_projection
from specops_services.gateway.heads import projection as gateway_heads_projection
from specops_services.gateway.runs import projection as gateway_projection
from specops_services.gateway.security import projection as gateway_security_projection
from specops_services.gateway.tune import projection as gateway_tune_projection
from specops_services.predictor import projection as predictor_projection
from specops_services.quality_gate import projection as gate_projection
from specplatform.db import Connection, connect, migrate, role_transaction, tenant_transaction

log = logging.getLogger(__name__)

# May SELECT every tenant's rows of the tables in `TABLES`, nothing else (022_rls_children.sql).
READER_ROLE = "specops_rebuild_reader"


class RebuildError(Exception):
    """The rebuild cannot start (the target database is not fresh); the message is one line."""


@dataclass(frozen=True, slots=True)
class Unwritten:
    """An event the projections refused, as the live service would have."""

    stream_seq: int
    type: str
    error: str


@dataclass(slots=True)
class RebuildReport:
    messages: int = 0
    events: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    unwritten: list[Unwritten] = field(default_factory=list)

    def summary(self) -> str:
        span = "" if self.first_seq is None else f" (stream seq {self.first_seq}..{self.last_seq})"
        text = f"rebuilt from {self.messages} messages{span}: {self.events} events projected"
        if self.unwritten:
            text += f", {len(self.unwritten)} not writable"
        return text


async def _project_owned(conn: Connection, event: Envelope[Any]) -> None:
    # Each owner writes in a transaction of its own, as it does live, acting for the
    # event's tenant (row-level security binds every service, schemas/sql/018_rls.sql).
    async with tenant_transaction(conn, event.tenant_id):
        await gateway_projection.rebuild(conn, event)
        await gateway_tune_projection.rebuild(conn, event)
        await gateway_heads_projection.rebuild(conn, event)
        await gateway_security_projection.project(conn, event)
    async with tenant_transaction(conn, event.tenant_id):
        await predictor_projection.project(conn, event)
        await bench_projection.project(conn, event)
        await gate_projection.project(conn, event)


async def _require_fresh(conn: Connection) -> None:
    async with role_transaction(conn, READER_ROLE):
        for spec in TABLES:
            query = sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(spec.name))
            cur = await conn.execute(query)
            row = await cur.fetchone()
            if row is not None and row["n"]:
                raise RebuildError(f"--into must be a fresh database: its {spec.name} has {row['n']} rows")


async def rebuild(
    nc: Client,
    into: str,
    start: ReplayStart,
    *,
    progress: Callable[[RebuildReport], None] | None = None,
) -> RebuildReport:
    """Migrate the database at `into`, then project every event of the stream from `start` into it."""
    await migrate(into, MIGRATIONS)
    report = RebuildReport()
    async with await connect(into, autocommit=True) as conn:
        await _require_fresh(conn)
        async for message in messages(nc, start):
            report.messages += 1
            report.first_seq = report.first_seq or message.seq
            report.last_seq = message.seq
            try:
                event = parse_event(message.data)
            except ValueError:
                continue  # a dead letter or a malformed message: no service wrote anything for it
            if event.subject != message.subject:
                continue
            try:
                await _project_owned(conn, event)
            except psycopg.Error as exc:
                error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                report.unwritten.append(Unwritten(message.seq, event.type, error))
                log.warning("stream seq %d (%s) not written: %s", message.seq, event.type, error)
                continue
            report.events += 1
            if progress is not None and report.events % 1000 == 0:
                progress(report)
    return report


async def _read(conn: Connection, spec: TableSpec) -> list[dict[str, Any]]:
    columns = sql.SQL(", ").join(map(sql.Identifier, (*spec.key, *spec.columns)))
    query = sql.SQL("SELECT {} FROM {}").format(columns, sql.Identifier(spec.name))
    async with role_transaction(conn, READER_ROLE):
        cur = await conn.execute(query)
        return await cur.fetchall()


async def diff(live: str, rebuilt: str) -> list[Difference]:
    """Every difference between the live database and the rebuilt one, table by table.

    Runs still in flight live differ from a rebuild taken earlier: compare when idle.
    """
    found: list[Difference] = []
    async with await connect(live, autocommit=True) as ours, await connect(rebuilt, autocommit=True) as new:
        for spec in TABLES:
            found.extend(diff_rows(spec, await _read(ours, spec), await _read(new, spec)))
    return found
