"""All of the predictor's SQL: the tables it owns (001_core: candidates, measured_history;
005_predictor to 007_one_writer: benches, predictor_runs; 014_datastores: predictor_datastores;
016_predictor_heads, 024_predictor_head_exports: predictor_heads).
It reads no other service's table.

Functions take an open connection and run inside the caller's transaction: the inbox
transaction of `specbus.process_once` or a `specplatform.db.tenant_transaction`, both of
one event's tenant. The predictor serves every tenant, one tenant per transaction: row-
level security (schemas/sql/018_rls.sql) shows it that tenant's rows only, behind the
explicit tenant filters here. Nothing a tenant measured (measured_history), uploaded
(predictor_datastores) or trained (predictor_heads) reaches another tenant's plan (F-S1).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import TypeAdapter

from speccatalog.targets import HeadRef
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import GateOutcome, Measurement, RankedCandidate
from specops_schemas.catalog import Family, Fingerprint
from specops_schemas.events import BenchPlan, CandidateFailure
from specops_schemas.heads import HeadTransitioned
from specops_schemas.registry import DatastoreRegistered
from specops_services.predictor.logic import Bench, RequestedRun, offered_states, registry_head
from specops_services.predictor.model import HistoryRow, temperature_bucket
from specops_services.predictor.plan import UploadedDatastore
from specplatform.db import opt_out

Connection = AsyncConnection[Any]

_MEASUREMENTS = TypeAdapter(list[Measurement])
_FAILURES = TypeAdapter(list[CandidateFailure])
_VERDICTS = TypeAdapter(dict[str, GateOutcome])


async def _rows(conn: Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    # Dict rows whatever row factory the caller's pool was configured with.
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return await cur.fetchall()


# --- runs ------------------------------------------------------------------------------------


async def record_run(conn: Connection, run_id: str, tenant_id: str) -> None:
    """Remember a run as requested here (a redelivered run.requested changes nothing)."""
    await conn.execute(
        "INSERT INTO predictor_runs (run_id, tenant_id) VALUES (%s, %s) ON CONFLICT (run_id) DO NOTHING",
        (run_id, tenant_id),
    )


async def lock_run(conn: Connection, run_id: str, tenant_id: str) -> RequestedRun | None:
    """The tenant's run as requested here, locked until the transaction ends; None if it never was."""
    rows = await _rows(
        conn,
        """SELECT ended_at IS NOT NULL AS ended FROM predictor_runs
           WHERE run_id = %s AND tenant_id = %s FOR UPDATE""",
        (run_id, tenant_id),
    )
    return RequestedRun(run_id, tenant_id, ended=rows[0]["ended"]) if rows else None


async def mark_ended(conn: Connection, run_id: str, tenant_id: str) -> None:
    """The run's run.completed or run.failed is out (ours, or another service's)."""
    await conn.execute(
        """UPDATE predictor_runs SET ended_at = coalesce(ended_at, now())
           WHERE run_id = %s AND tenant_id = %s""",
        (run_id, tenant_id),
    )


# --- planning --------------------------------------------------------------------------------


async def is_planned(conn: Connection, run_id: str) -> bool:
    """Whether this run has a plan already (another `run.requested` for it was handled)."""
    rows = await _rows(conn, "SELECT 1 FROM candidates WHERE run_id = %s LIMIT 1", (run_id,))
    return bool(rows)


async def recent_history(
    conn: Connection, tenant_id: str, fingerprint: Fingerprint, limit: int
) -> list[HistoryRow]:
    """The tenant's newest measured_history rows of a fingerprint (other fingerprints never
    match; another tenant's rows never count, F-S1)."""
    rows = await _rows(
        conn,
        """SELECT family, draft, fingerprint, temperature, k, acceptance_rate, mean_acceptance_length,
                  speedup, model_ref, gpu, tree, weight
           FROM measured_history WHERE tenant_id = %s AND fingerprint = %s AND speedup IS NOT NULL
           ORDER BY created_at DESC, id DESC LIMIT %s""",
        (tenant_id, fingerprint.value, limit),
    )
    return [
        HistoryRow(
            family=Family(r["family"]),
            fingerprint=Fingerprint(r["fingerprint"]),
            temperature=r["temperature"],
            k=r["k"],
            acceptance=r["acceptance_rate"],
            speedup=r["speedup"],
            mean_acceptance_length=r["mean_acceptance_length"],
            tree=tuple(r["tree"]) if r["tree"] else None,
            draft=r["draft"],
            target_ref=r["model_ref"],
            gpu=r["gpu"],
            weight=r["weight"],
        )
        for r in rows
    ]


async def save_candidates(
    conn: Connection, run_id: str, ranked: Sequence[RankedCandidate], *, created_at: datetime
) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(
            """INSERT INTO candidates (run_id, candidate_id, rank, family, candidate, prediction, created_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s)""",
            [
                (
                    run_id,
                    r.candidate.candidate_id,
                    r.prediction.rank,
                    r.candidate.family.value,
                    Jsonb(r.candidate.model_dump(mode="json")),
                    Jsonb(r.prediction.model_dump(mode="json")),
                    created_at,
                )
                for r in ranked
            ],
        )


async def ranked_candidates(conn: Connection, run_id: str) -> list[RankedCandidate]:
    rows = await _rows(
        conn, "SELECT candidate, prediction FROM candidates WHERE run_id = %s ORDER BY rank", (run_id,)
    )
    return [RankedCandidate.model_validate(r) for r in rows]


async def create_bench(conn: Connection, bench: Bench) -> None:
    await conn.execute(
        """INSERT INTO benches (bench_id, run_id, tenant_id, request, plan) VALUES (%s, %s, %s, %s, %s)""",
        (
            bench.bench_id,
            bench.run_id,
            bench.tenant_id,
            Jsonb(bench.request.model_dump(mode="json")),
            Jsonb(bench.plan.model_dump(mode="json")),
        ),
    )


async def record_datastore(conn: Connection, tenant_id: str, ds: DatastoreRegistered) -> None:
    """Remember a tenant's uploaded datastore (a redelivered registration changes nothing)."""
    await conn.execute(
        """INSERT INTO predictor_datastores (datastore_id, tenant_id, name, size_bytes, fingerprints)
           VALUES (%s, %s, %s, %s, %s) ON CONFLICT (datastore_id) DO NOTHING""",
        (ds.datastore_id, tenant_id, ds.name, ds.size_bytes, [str(f) for f in ds.fingerprints]),
    )


async def tenant_datastores(conn: Connection, tenant_id: str) -> list[UploadedDatastore]:
    """The datastores `tenant_id` uploaded; never another tenant's (F-S1)."""
    rows = await _rows(
        conn,
        """SELECT datastore_id, size_bytes, fingerprints FROM predictor_datastores
           WHERE tenant_id = %s ORDER BY datastore_id""",
        (tenant_id,),
    )
    return [UploadedDatastore(r["datastore_id"], r["size_bytes"], frozenset(r["fingerprints"])) for r in rows]


async def record_head(conn: Connection, tenant_id: str, moved: HeadTransitioned) -> None:
    """Fold a head's move into its row; an older move than the one stored changes nothing."""
    artifact = moved.artifact
    await conn.execute(
        """INSERT INTO predictor_heads AS h (head_id, tenant_id, target_ref, family, state, num_heads,
               eagle_version, params, artifact_path, speculators_path, acceptance_rate,
               mean_acceptance_length, transitioned_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (head_id) DO UPDATE SET
               state = EXCLUDED.state,
               target_ref = EXCLUDED.target_ref,
               num_heads = COALESCE(EXCLUDED.num_heads, h.num_heads),
               eagle_version = COALESCE(EXCLUDED.eagle_version, h.eagle_version),
               params = COALESCE(EXCLUDED.params, h.params),
               artifact_path = COALESCE(EXCLUDED.artifact_path, h.artifact_path),
               speculators_path = COALESCE(EXCLUDED.speculators_path, h.speculators_path),
               acceptance_rate = COALESCE(EXCLUDED.acceptance_rate, h.acceptance_rate),
               mean_acceptance_length = COALESCE(EXCLUDED.mean_acceptance_length, h.mean_acceptance_length),
               transitioned_at = EXCLUDED.transitioned_at,
               updated_at = now()
           WHERE h.tenant_id = EXCLUDED.tenant_id AND h.transitioned_at <= EXCLUDED.transitioned_at""",
        (
            moved.head_id,
            tenant_id,
            moved.tenant_target,
            moved.family,
            moved.transition.to_state,
            artifact.num_heads if artifact else None,
            artifact.eagle_version if artifact else None,
            artifact.params if artifact else None,
            artifact.path if artifact else None,
            artifact.speculators.path if artifact and artifact.speculators else None,
            moved.acceptance_rate,
            moved.mean_acceptance_length,
            moved.transition.at,
        ),
    )


async def tenant_heads(conn: Connection, tenant_id: str, *, include_uat: bool) -> list[HeadRef]:
    """The registry heads `tenant_id` may use in a run: production ones, uat ones too when the
    run asks; never another tenant's, never a deprecated one. The catalog keeps those of the
    run's target."""
    rows = await _rows(
        conn,
        """SELECT head_id, target_ref, family, num_heads, eagle_version, params, artifact_path,
                  speculators_path, acceptance_rate
           FROM predictor_heads
           WHERE tenant_id = %s AND state = ANY(%s) AND artifact_path IS NOT NULL
           ORDER BY head_id""",
        (tenant_id, sorted(offered_states(include_uat))),
    )
    return [head for head in (registry_head(**r) for r in rows) if head is not None]


# --- security policies (F-S3) -----------------------------------------------------------------


# Whether each tenant opts out, folded from `security.policy_changed`: a plan reads it held (`hold=True`),
# so that a fold waits for the plan's bench; an answer reads it unheld, its bench locked.
POLICIES = opt_out.OptOuts("predictor_policies")


# --- measuring --------------------------------------------------------------------------------


async def lock_bench(conn: Connection, bench_id: str) -> Bench | None:
    """The bench, locked until the transaction ends; None for a bench this service did not plan.

    Every writer of a bench takes this lock first, so whichever of bench.completed and
    the last gate.evaluated commits second sees the other's rows.
    """
    rows = await _rows(
        conn,
        """SELECT bench_id, run_id, tenant_id, request, plan, baseline, results, failures,
                  finalized_at IS NOT NULL OR failed_at IS NOT NULL AS finalized
           FROM benches WHERE bench_id = %s FOR UPDATE""",
        (bench_id,),
    )
    if not rows:
        return None
    r = rows[0]
    return Bench(
        bench_id=r["bench_id"],
        run_id=r["run_id"],
        tenant_id=r["tenant_id"],
        request=RunCreateRequest.model_validate(r["request"]),
        plan=BenchPlan.model_validate(r["plan"]),
        baseline=Measurement.model_validate(r["baseline"]) if r["baseline"] is not None else None,
        results=_MEASUREMENTS.validate_python(r["results"]) if r["results"] is not None else None,
        failures=_FAILURES.validate_python(r["failures"] or []),
        finalized=r["finalized"],
    )


async def complete_bench(
    conn: Connection,
    bench_id: str,
    *,
    baseline: Measurement,
    results: Sequence[Measurement],
    failures: Sequence[CandidateFailure],
) -> None:
    await conn.execute(
        """UPDATE benches SET baseline = %s, results = %s, failures = %s, completed_at = now()
           WHERE bench_id = %s""",
        (
            Jsonb(baseline.model_dump(mode="json")),
            Jsonb([m.model_dump(mode="json") for m in results]),
            Jsonb([f.model_dump(mode="json") for f in failures]),
            bench_id,
        ),
    )


async def verdicts(conn: Connection, bench_id: str) -> dict[str, GateOutcome]:
    """The gate.evaluated verdicts received for a bench, by candidate_id."""
    rows = await _rows(conn, "SELECT verdicts FROM benches WHERE bench_id = %s", (bench_id,))
    return _VERDICTS.validate_python(rows[0]["verdicts"]) if rows else {}


async def save_verdicts(conn: Connection, bench_id: str, received: dict[str, GateOutcome]) -> None:
    await conn.execute(
        "UPDATE benches SET verdicts = %s WHERE bench_id = %s",
        (Jsonb({cid: outcome.model_dump(mode="json") for cid, outcome in received.items()}), bench_id),
    )


async def open_benches(conn: Connection, tenant_id: str) -> list[str]:
    """The tenant's benches whose run is not answered (neither finalized nor failed)."""
    rows = await _rows(
        conn,
        """SELECT bench_id FROM benches
           WHERE tenant_id = %s AND finalized_at IS NULL AND failed_at IS NULL ORDER BY bench_id""",
        (tenant_id,),
    )
    return [r["bench_id"] for r in rows]


async def mark_finalized(conn: Connection, bench_id: str) -> None:
    await conn.execute("UPDATE benches SET finalized_at = now() WHERE bench_id = %s", (bench_id,))


async def mark_failed(conn: Connection, bench_id: str) -> None:
    """The bench is closed unanswered: its run was failed for good (`run.failed` of another
    service, e.g. the gateway's reaper), or ended without speculation (its tenant opted out)."""
    await conn.execute("UPDATE benches SET failed_at = now() WHERE bench_id = %s", (bench_id,))


# --- what an answer teaches ---------------------------------------------------------------------


async def append_history(
    conn: Connection, rows: Sequence[HistoryRow], *, tenant_id: str, run_id: str, bench_id: str
) -> None:
    """Keep what the tenant's run measured, for that tenant's later plans only."""
    async with conn.cursor() as cur:
        await cur.executemany(
            """INSERT INTO measured_history (tenant_id, family, draft, fingerprint, temperature_bucket,
                   temperature, k, acceptance_rate, mean_acceptance_length, speedup, model_ref, gpu, tree,
                   weight, run_id, bench_id)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            [
                (
                    tenant_id,
                    r.family.value,
                    r.draft,
                    r.fingerprint.value,
                    temperature_bucket(r.temperature),
                    r.temperature,
                    r.k,
                    r.acceptance,
                    r.mean_acceptance_length,
                    r.speedup,
                    r.target_ref,
                    r.gpu,
                    list(r.tree) if r.tree else None,
                    r.weight,
                    run_id,
                    bench_id,
                )
                for r in rows
            ],
        )
