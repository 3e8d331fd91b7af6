"""Audit settings: the runtime's connection settings plus the audit's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.settings import Settings, service_settings


class AuditSettings(Settings):
    """`SPECOPS_AUDIT_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings)."""

    audit_pool_size: int = Field(2, ge=2, le=100, description="Largest number of Postgres connections.")


def audit_settings(given: Settings | None = None) -> AuditSettings:
    """The audit's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(AuditSettings, given)
