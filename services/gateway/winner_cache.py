"""The 30-day winner cache: its key and lifetime (T1).

The gateway owns winner_cache: its projector stores a run's answer under `key_columns`
of the run's request when it records the run's run.completed, and POST /runs looks a
request up under the same function, so a stored winner is always found again.
"""

from __future__ import annotations

from datetime import timedelta

from speccatalog.hardware import resolve_profile
from specops_schemas.api import RunCreateRequest

CACHE_TTL = timedelta(days=30)

# The winner_cache primary key (schemas/sql/001_core.sql), in its column order.
KEY_COLUMNS = (
    "cache_scope",
    "model_ref",
    "gpu",
    "engine",
    "engine_version",
    "fingerprint",
    "mode",
    "quality_gate",
)


def key_columns(request: RunCreateRequest, *, tenant_id: str) -> dict[str, str]:
    """The winner_cache row key of a request (KEY_COLUMNS -> value).

    Scoped per tenant (F-S1: one tenant's winners never reveal another's workload); the
    GPU is the canonical profile name (`h100` and `H100-80GB` share winners), with the
    request's gpu_count when it names one (`H100-80GBx2`: another deployment, another answer); a
    request without engine_version is stored under '' (the table's "no version").
    """
    target = request.target
    gpu = resolve_profile(target.gpu).name
    return {
        "cache_scope": tenant_id,
        "model_ref": target.model_ref,
        "gpu": gpu if target.gpu_count is None else f"{gpu}x{target.gpu_count}",
        "engine": target.engine.value,
        "engine_version": target.engine_version or "",
        "fingerprint": request.workload.fingerprint.value,
        "mode": request.mode.value,
        "quality_gate": request.goal.quality_gate.value,
    }


def cacheable(request: RunCreateRequest) -> bool:
    """Whether a run reads and writes the winner cache: not one that asked for the tenant's uat heads
    (`include_uat_heads`), whose answer may rest on a head not signed off for production."""
    return not request.include_uat_heads
