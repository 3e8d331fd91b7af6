"""Gateway settings: the runtime's connection settings plus the gateway's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.settings import Settings, service_settings


class GatewaySettings(Settings):
    """Read from `SPECOPS_GATEWAY_*` (and DATABASE_URL / NATS_URL, see specplatform.settings)."""

    gateway_sse_poll_s: float = Field(
        0.25, gt=0.0, le=10.0, description="How often an open event stream looks for new run events."
    )
    gateway_sse_keepalive_s: float = Field(
        15.0, gt=0.0, description="Idle seconds after which an event stream sends a keepalive comment."
    )
    gateway_projector: bool = Field(
        True, description="Run the projector (bus events -> runs / run_events) in this process."
    )
    gateway_relay: bool = Field(
        True, description="Run the outbox relay (outbox rows -> NATS) in this process."
    )
    gateway_pool_size: int = Field(10, ge=2, le=200, description="Largest number of Postgres connections.")
    gateway_db_timeout_s: float = Field(
        3.0,
        gt=0.0,
        description="How long a request waits for a database connection; then it is a 503 with Retry-After.",
    )
    gateway_retry_after_s: int = Field(
        5, ge=1, description="The Retry-After (seconds) of a 503 answered while the database is unreachable."
    )
    gateway_sse_token_check_s: float = Field(
        30.0,
        gt=0.0,
        description="How often an open event stream re-checks its token; a revoked token ends the stream.",
    )
    gateway_metrics_refresh_s: float = Field(
        15.0, gt=0.0, description="How often the runs-by-state gauge is recounted from the runs table."
    )
    gateway_max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest request body accepted; a larger one is a 413."
    )
    gateway_intake: bool = Field(
        True, description="Take upstream systems' run requests from NATS (specops.intake.<tenant>.>)."
    )
    gateway_max_active_runs: int = Field(
        32,
        ge=1,
        description="Runs a tenant may have queued or running at once; more are refused (429 or rejected).",
    )


def gateway_settings(given: Settings | None = None) -> GatewaySettings:
    """The gateway's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(GatewaySettings, given)
