"""Gateway settings: the runtime's connection settings plus the gateway's own knobs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import AliasChoices, Field

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
    datastore_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="SPECOPS_DATASTORE_MAX_BYTES: largest corpus `POST datastores` accepts (streamed to "
        "the artifact store, so the body limit above does not apply to it); a larger one is a 413.",
    )
    gateway_intake: bool = Field(
        True, description="Take upstream systems' run requests from NATS (specops.intake.<tenant>.>)."
    )
    gateway_max_active_runs: int = Field(
        32,
        ge=1,
        description="Runs a tenant may have queued or running at once; more are refused (429 or rejected).",
    )

    gateway_console_session_idle_s: float = Field(
        8 * 3600.0,
        gt=0.0,
        le=7 * 86400.0,
        description="A console session unused this long (seconds, at most 7 days) ends: sign in again.",
    )
    gateway_console_session_max_s: float = Field(
        24 * 3600.0,
        gt=0.0,
        le=30 * 86400.0,
        description="A console session ends this long (seconds, at most 30 days) after sign-in, "
        "however used.",
    )
    gateway_models_dir: Path | None = Field(
        None,
        description="The one directory whose model directories a run's model_ref may name by path "
        "(symlinks and `..` resolved first); None: model_ref takes only catalog aliases and hub ids.",
    )
    gateway_policy_wait_s: float = Field(
        10.0,
        ge=0.0,
        le=120.0,
        description="How long PUT security/policy waits for the security service to apply the change "
        "(200 with the new policy); past it, 202 and the change lands shortly after.",
    )
    enable_auto_workload_fingerprint: bool = Field(
        False,
        validation_alias=AliasChoices(
            "ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT", "enable_auto_workload_fingerprint"
        ),
        description="ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT: a run asking for `auto` without samples takes "
        "its fingerprint from its tenant's latest live summary of the target's traffic, which engine "
        "servers with the same flag publish; without it, such a run is a 422.",
    )
    gateway_reaper: bool = Field(
        True,
        description="Fail the runs that made no progress within their stage's deadline (the reaper).",
    )
    reaper_interval_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="SPECOPS_REAPER_INTERVAL_S: how often the reaper looks."
    )
    # Deadlines per stage, since the run's latest event. Sized for the CPU host, where a
    # bench waits behind the benches of the runs before it and measures for minutes.
    stage_deadline_queued_s: float = Field(
        600.0, gt=0.0, description="SPECOPS_STAGE_DEADLINE_QUEUED_S: a run waits this long for a predictor."
    )
    stage_deadline_predicting_s: float = Field(
        600.0, gt=0.0, description="SPECOPS_STAGE_DEADLINE_PREDICTING_S: planning a run."
    )
    stage_deadline_benchmarking_s: float = Field(
        1800.0,
        gt=0.0,
        description="SPECOPS_STAGE_DEADLINE_BENCHMARKING_S: between two events of a bench (queued "
        "behind others, loading models, measuring reps).",
    )
    stage_deadline_gating_s: float = Field(
        1200.0, gt=0.0, description="SPECOPS_STAGE_DEADLINE_GATING_S: between two verdicts of the gate."
    )

    def stage_deadlines(self) -> dict[str, timedelta]:
        """The deadline of each stage of `logic.STALL_STAGES`."""
        return {
            "queued": timedelta(seconds=self.stage_deadline_queued_s),
            "predicting": timedelta(seconds=self.stage_deadline_predicting_s),
            "benchmarking": timedelta(seconds=self.stage_deadline_benchmarking_s),
            "gating": timedelta(seconds=self.stage_deadline_gating_s),
        }


def gateway_settings(given: Settings | None = None) -> GatewaySettings:
    """The gateway's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(GatewaySettings, given)
