"""Head-trainer settings: the runtime's connection settings plus the trainer's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.hostlock import MeasureLockDir
from specplatform.settings import Settings, service_settings


class HeadTrainerSettings(Settings):
    """`SPECOPS_THREADS`, `SPECOPS_HEAD_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings)."""

    threads: int = Field(2, ge=1, le=1024, description="CPU threads PyTorch may use.")
    head_device: str = Field("auto", description="Where the target runs while training: auto, cpu or cuda.")
    head_dtype: str = Field("auto", description="Target dtype: auto, float32, bfloat16 or float16.")
    head_models: int = Field(1, ge=1, le=16, description="Targets kept loaded between heads.")
    measure_lock_dir: MeasureLockDir
    head_ack_wait_s: float = Field(
        15.0,
        gt=0.0,
        le=300.0,
        description="Seconds after which a head whose trainer died is redelivered (and resumed from its "
        "checkpoint); a live trainer extends it by a heartbeat every third of it.",
    )
    head_checkpoint_every: int = Field(
        25, ge=1, le=100_000, description="Optimizer steps between checkpoints (and at each epoch's end)."
    )
    head_batch_tokens: int = Field(
        4096, ge=64, le=1_048_576, description="Training tokens per optimizer step (the device's memory)."
    )


def trainer_settings(given: Settings | None = None) -> HeadTrainerSettings:
    """The trainer's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(HeadTrainerSettings, given)
