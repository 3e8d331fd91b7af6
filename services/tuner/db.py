"""All of the tuner's SQL: the tables it owns (012_tuner: tuner_sessions, tuner_trials; Optuna
writes its own schema `optuna` through study.py). It reads no other service's table.

Functions take an open connection and run inside the caller's transaction: a tenant's
(`specbus.process_once`, `specplatform.db.tenant_transaction`), whose row-level security
shows that tenant's sessions only, except `running_sessions`, which spans tenants as
TICKER (schemas/sql/018_rls.sql).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import TypeAdapter

from specops_schemas.candidates import Candidate, GateOutcome, Measurement
from specops_schemas.tune import CurvePoint, Dimension, TrialResult, TuneRequested
from specops_services.tuner.logic import Session, Trial
from specplatform.db import opt_out

Connection = AsyncConnection[Any]

# The narrow role that sees every tenant's open sessions (ids and tenants), for the budget ticker.
TICKER = "specops_tuner_ticker"

_DIMENSIONS = TypeAdapter(list[Dimension])
_CURVE = TypeAdapter(list[CurvePoint])

_SESSION_COLUMNS = """session_id, tenant_id, request, space, seeded, budget_s, started_at, deadline,
    heartbeat_at, downtime_s, dropped, importances, rule_checked, auto_terminated, curve, stop_reason,
    ended_at IS NOT NULL AS ended"""


def _json(model: Any) -> Jsonb | None:
    return None if model is None else Jsonb(model.model_dump(mode="json"))


async def _rows(conn: Connection, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()


async def insert_session(conn: Connection, s: Session) -> None:
    await conn.execute(
        """INSERT INTO tuner_sessions (session_id, tenant_id, request, space, seeded, budget_s, started_at,
               deadline, heartbeat_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (
            s.session_id,
            s.tenant_id,
            _json(s.requested),
            Jsonb(_DIMENSIONS.dump_python(s.space, mode="json")),
            s.seeded,
            s.budget_s,
            s.started_at,
            s.deadline,
            s.heartbeat_at,
        ),
    )


def _session(r: dict[str, Any]) -> Session:
    return Session(
        session_id=r["session_id"],
        tenant_id=r["tenant_id"],
        requested=TuneRequested.model_validate(r["request"]),
        space=_DIMENSIONS.validate_python(r["space"]),
        seeded=r["seeded"],
        budget_s=r["budget_s"],
        started_at=r["started_at"],
        deadline=r["deadline"],
        heartbeat_at=r["heartbeat_at"],
        downtime_s=r["downtime_s"],
        dropped=r["dropped"],
        importances=r["importances"],
        rule_checked=r["rule_checked"],
        auto_terminated=r["auto_terminated"],
        curve=_CURVE.validate_python(r["curve"]),
        stop_reason=r["stop_reason"],
        ended=r["ended"],
    )


async def lock_session(conn: Connection, session_id: str, *, skip_locked: bool = False) -> Session | None:
    """The session, locked until the transaction ends; None for no session of this tuner.

    Every writer of a session and its trials takes this lock first, so its handlers
    (and replicas, and the ticker) change a session one at a time.
    """
    lock = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
    rows = await _rows(
        conn, f"SELECT {_SESSION_COLUMNS} FROM tuner_sessions WHERE session_id = %s {lock}", (session_id,)
    )
    return _session(rows[0]) if rows else None


async def save_session(
    conn: Connection, s: Session, *, ended_at: datetime | None = None, failed: bool = False
) -> None:
    """Store what a step changed of a session (everything but its request, space and clock)."""
    await conn.execute(
        """UPDATE tuner_sessions SET heartbeat_at = %s, downtime_s = %s, dropped = %s, importances = %s,
               rule_checked = %s, auto_terminated = %s, curve = %s, stop_reason = %s,
               ended_at = COALESCE(ended_at, %s), failed = failed OR %s
           WHERE session_id = %s""",
        (
            s.heartbeat_at,
            s.downtime_s,
            Jsonb(s.dropped),
            Jsonb(s.importances),
            s.rule_checked,
            s.auto_terminated,
            Jsonb(_CURVE.dump_python(s.curve, mode="json")),
            s.stop_reason,
            ended_at,
            failed,
            s.session_id,
        ),
    )


async def running_sessions(conn: Connection) -> list[tuple[str, str]]:
    """Every tenant's sessions not yet ended, as (session_id, tenant_id); as TICKER."""
    rows = await _rows(
        conn, "SELECT session_id, tenant_id FROM tuner_sessions WHERE ended_at IS NULL ORDER BY session_id"
    )
    return [(r["session_id"], r["tenant_id"]) for r in rows]


async def open_sessions(conn: Connection, tenant_id: str) -> list[str]:
    """The tenant's sessions not yet ended."""
    rows = await _rows(
        conn,
        "SELECT session_id FROM tuner_sessions WHERE tenant_id = %s AND ended_at IS NULL ORDER BY session_id",
        (tenant_id,),
    )
    return [r["session_id"] for r in rows]


async def session_of_bench(conn: Connection, bench_id: str) -> str | None:
    """The session whose trial a bench measures; None for a bench of no trial (a T1 run's)."""
    rows = await _rows(conn, "SELECT session_id FROM tuner_trials WHERE bench_id = %s", (bench_id,))
    return rows[0]["session_id"] if rows else None


_TRIAL_COLUMNS = """trial, bench_id, candidate, params, seeded, state, value, baseline, measurement, gate,
    error_stage, error_message, started_at, finished_at"""


def _trial(r: dict[str, Any]) -> Trial:
    m = Measurement.model_validate(r["measurement"]) if r["measurement"] is not None else None
    result = TrialResult(
        trial=r["trial"],
        bench_id=r["bench_id"],
        candidate=Candidate.model_validate(r["candidate"]),
        params=r["params"],
        seeded=r["seeded"],
        state=r["state"],
        value=r["value"],
        speedup=(m.speedup_mean or m.speedup) if m else None,
        speedup_stdev=m.speedup_stdev if m else None,
        measurement=m,
        gate=GateOutcome.model_validate(r["gate"]) if r["gate"] is not None else None,
        error_stage=r["error_stage"],
        error_message=r["error_message"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
    )
    baseline = Measurement.model_validate(r["baseline"]) if r["baseline"] is not None else None
    return Trial(result, baseline)


async def trials(conn: Connection, session_id: str) -> list[Trial]:
    rows = await _rows(
        conn, f"SELECT {_TRIAL_COLUMNS} FROM tuner_trials WHERE session_id = %s ORDER BY trial", (session_id,)
    )
    return [_trial(r) for r in rows]


async def insert_trial(conn: Connection, session_id: str, t: Trial) -> None:
    r = t.result
    await conn.execute(
        """INSERT INTO tuner_trials (session_id, trial, bench_id, candidate, params, seeded, state, value,
               error_stage, error_message, started_at, finished_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (
            session_id,
            r.trial,
            r.bench_id,
            _json(r.candidate),
            Jsonb(r.params),
            r.seeded,
            r.state,
            r.value,
            r.error_stage,
            r.error_message,
            r.started_at,
            r.finished_at,
        ),
    )


async def save_trial(conn: Connection, session_id: str, t: Trial) -> None:
    r = t.result
    await conn.execute(
        """UPDATE tuner_trials SET state = %s, value = %s, baseline = %s, measurement = %s, gate = %s,
               error_stage = %s, error_message = %s, finished_at = %s
           WHERE session_id = %s AND trial = %s""",
        (
            r.state,
            r.value,
            _json(t.baseline),
            _json(r.measurement),
            _json(r.gate),
            r.error_stage,
            r.error_message,
            r.finished_at,
            session_id,
            r.trial,
        ),
    )


# --- security policies (F-S3) -----------------------------------------------------------------


# Whether each tenant opts out, folded from `security.policy_changed`: a session's start reads it held
# (`hold=True`), so that a fold waits for the new session; a later step reads it unheld, its
# session locked.
POLICIES = opt_out.OptOuts("tuner_policies")
