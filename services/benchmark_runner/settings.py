"""Benchmark-runner settings: the runtime's connection settings plus the runner's own knobs."""

from __future__ import annotations

from pydantic import Field

from specplatform.hostlock import MeasureLockDir
from specplatform.settings import Settings, service_settings


class BenchmarkRunnerSettings(Settings):
    """`SPECOPS_THREADS`, `SPECOPS_BENCH_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings)."""

    threads: int = Field(2, ge=1, le=1024, description="CPU threads PyTorch may use.")
    bench_device: str = Field("auto", description="Where the target runs: auto, cpu or cuda.")
    bench_dtype: str = Field("auto", description="Target dtype: auto, float32, bfloat16 or float16.")
    bench_models: int = Field(1, ge=1, le=16, description="Targets kept loaded between benches.")
    measure_lock_dir: MeasureLockDir
    bench_ack_wait_s: float = Field(
        15.0,
        gt=0.0,
        le=300.0,
        description="Seconds after which a bench whose runner died is redelivered; a live runner "
        "extends it by a heartbeat every third of it, however long the bench takes.",
    )


def runner_settings(given: Settings | None = None) -> BenchmarkRunnerSettings:
    """The runner's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(BenchmarkRunnerSettings, given)
