"""The gateway's SQL of the live workloads (025_live_workloads): the latest summary per
(tenant, served model). Callers hold a tenant transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from specops_schemas.serve import WorkloadSummarized
from specplatform.db import Connection


@dataclass(frozen=True, slots=True)
class LiveSummary:
    summary: WorkloadSummarized
    summarized_at: datetime


async def save(conn: Connection, summary: WorkloadSummarized, summarized_at: datetime) -> bool:
    """Keep the summary unless a later one of its tenant and model is there; whether it was kept."""
    cur = await conn.execute(
        """
        INSERT INTO gateway_live_workloads (tenant_id, model_ref, server_id, summary, summarized_at)
        VALUES (%s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id, model_ref) DO UPDATE
            SET server_id = EXCLUDED.server_id, summary = EXCLUDED.summary,
                summarized_at = EXCLUDED.summarized_at
            WHERE gateway_live_workloads.summarized_at < EXCLUDED.summarized_at
        """,
        (
            summary.tenant,
            summary.model_ref,
            summary.server_id,
            Jsonb(summary.model_dump(mode="json")),
            summarized_at,
        ),
    )
    return cur.rowcount == 1


async def latest(conn: Connection, tenant_id: str, model_ref: str) -> LiveSummary | None:
    """The tenant's latest summary of the model's traffic, or None."""
    cur = await conn.execute(
        "SELECT summary, summarized_at FROM gateway_live_workloads WHERE tenant_id = %s AND model_ref = %s",
        (tenant_id, model_ref),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return LiveSummary(WorkloadSummarized.model_validate(row["summary"]), row["summarized_at"])
