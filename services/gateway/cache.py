"""The 30-day winner cache: its key and its freshness rule (seed 000, T1).

The gateway owns winner_cache: its projector stores a run's answer under `key_columns`
of the run's request when it records the run's run.completed, and POST /runs looks a
request up under the same function, so a stored winner is always found again.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from speccatalog.hardware import resolve_profile
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import Engine, Fingerprint, GateMethod, Mode

CACHE_TTL = timedelta(days=30)
# Bumped when the key's recipe changes, so that old rows stop matching instead of colliding.
KEY_VERSION = 1

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
    GPU is the canonical profile name (`h100` and `H100-80GB` share winners); a request
    without engine_version is stored under '' (the table's "no version").
    """
    target = request.target
    return {
        "cache_scope": tenant_id,
        "model_ref": target.model_ref,
        "gpu": resolve_profile(target.gpu).name,
        "engine": target.engine.value,
        "engine_version": target.engine_version or "",
        "fingerprint": request.workload.fingerprint.value,
        "mode": request.mode.value,
        "quality_gate": request.goal.quality_gate.value,
    }


def cache_key(
    model_ref: str,
    gpu: str,
    engine: Engine,
    engine_version: str,
    fingerprint: Fingerprint,
    mode: Mode,
    quality_gate: GateMethod,
    *,
    tenant_id: str | None = None,
) -> str:
    """Hex sha256 of the fields that decide a winner (and of the tenant when caches are per-tenant).

    `engine_version` must be resolved first (the installed version when the request
    leaves it out): a winner measured on one engine version says little about another.
    `tenant_id` None is the shared cache; a tenant id scopes it (security F-S1).
    """
    fields = {
        "v": KEY_VERSION,
        "model_ref": model_ref,
        "gpu": gpu,
        "engine": str(engine),
        "engine_version": engine_version,
        "fingerprint": str(fingerprint),
        "mode": str(mode),
        "quality_gate": str(quality_gate),
        "tenant_id": tenant_id,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def request_cache_key(request: RunCreateRequest, engine_version: str, *, tenant_id: str | None = None) -> str:
    """cache_key of a run request, with the engine version the service resolved.

    The gpu is the canonical profile name (`h100` and `H100-80GB` share winners);
    UnknownHardware for an unknown one.
    """
    t = request.target
    return cache_key(
        t.model_ref,
        resolve_profile(t.gpu).name,
        t.engine,
        t.engine_version or engine_version,
        request.workload.fingerprint,
        request.mode,
        request.goal.quality_gate,
        tenant_id=tenant_id,
    )


def is_fresh(created_at: datetime, now: datetime) -> bool:
    """Whether a winner stored at `created_at` may still answer at `now` (both timezone-aware)."""
    if created_at.tzinfo is None or now.tzinfo is None:
        raise ValueError("cache timestamps must be timezone-aware")
    return now - created_at < CACHE_TTL
