"""Tuner settings: the runtime's connection settings plus the tuner's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.settings import Settings, service_settings


class TunerSettings(Settings):
    """Read from `SPECOPS_*` (and DATABASE_URL / NATS_URL, see specplatform.settings)."""

    tuner_reps: int = Field(
        3,
        ge=2,
        le=100,
        description="SPECOPS_TUNER_REPS: reps per trial when the request names none (sigma needs 2).",
    )
    tuner_prompts: int = Field(
        3, ge=1, le=10_000, description="SPECOPS_TUNER_PROMPTS: prompts per trial's bench."
    )
    tuner_new_tokens: int = Field(
        48, ge=1, le=32_768, description="SPECOPS_TUNER_NEW_TOKENS: tokens per prompt in a trial's bench."
    )
    tuner_parallel_trials: int = Field(
        1, ge=1, le=64, description="SPECOPS_TUNER_PARALLEL_TRIALS: trials of a session measured at once."
    )
    tuner_tick_s: float = Field(
        5.0, gt=0.0, le=600.0, description="SPECOPS_TUNER_TICK_S: period of the budget clock's heartbeat."
    )
    tuner_grace_s: float = Field(
        60.0,
        ge=0.0,
        le=86_400.0,
        description="SPECOPS_TUNER_GRACE_S: how long past its deadline a session's last trial may run "
        "before it is cut (failed as timeout) and the session completed.",
    )
    tuner_narrow_after: int = Field(
        6,
        ge=3,
        le=10_000,
        description="SPECOPS_TUNER_NARROW_AFTER: complete trials before importances are computed.",
    )
    tuner_narrow_threshold: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="SPECOPS_TUNER_NARROW_THRESHOLD: importance below which a dimension is fixed "
        "at the best trial's value.",
    )
    tuner_pool_size: int = Field(4, ge=2, le=100, description="Largest number of Postgres connections.")


def tuner_settings(given: Settings | None = None) -> TunerSettings:
    """The tuner's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(TunerSettings, given)
