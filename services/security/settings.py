"""Security service settings: the runtime's connection settings plus the service's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.settings import Settings, service_settings


class SecuritySettings(Settings):
    """`SPECOPS_SECURITY_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings)."""

    security_pool_size: int = Field(4, ge=2, le=100, description="Largest number of Postgres connections.")


def security_settings(given: Settings | None = None) -> SecuritySettings:
    """The security service's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(SecuritySettings, given)
