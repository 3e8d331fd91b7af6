"""The runner's settings and its one blocking call: measure a plan on the cached target.

`BenchRunner.measure` blocks for as long as the bench takes (minutes on a CPU); the
app calls it in a worker thread. The target stays loaded between benches (ModelCache).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from pydantic import Field

from speccore.model_cache import ModelCache
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.measure import BenchOutcome, RepCallback, RepRow, measure
from specplatform.settings import Settings, load_settings


class BenchmarkRunnerSettings(Settings):
    """`SPECOPS_THREADS`, `SPECOPS_BENCH_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings)."""

    threads: int = Field(2, ge=1, le=1024, description="CPU threads PyTorch may use.")
    bench_device: str = Field("auto", description="Where the target runs: auto, cpu or cuda.")
    bench_dtype: str = Field("auto", description="Target dtype: auto, float32, bfloat16 or float16.")
    bench_models: int = Field(1, ge=1, le=16, description="Targets kept loaded between benches.")
    bench_ack_wait_s: float = Field(
        15.0,
        gt=0.0,
        le=300.0,
        description="Seconds after which a bench whose runner died is redelivered; a live runner "
        "extends it by a heartbeat every third of it, however long the bench takes.",
    )


def runner_settings(settings: Settings | None = None) -> BenchmarkRunnerSettings:
    """The runner's settings; `settings` (e.g. what `specops serve` loaded) gives the URLs."""
    if isinstance(settings, BenchmarkRunnerSettings):
        return settings
    state_dir = settings.state_dir if settings is not None else None
    loaded = load_settings(state_dir, cls=BenchmarkRunnerSettings)
    if settings is None:
        return loaded
    return loaded.model_copy(update={"nats_url": settings.nats_url, "database_url": settings.database_url})


class BenchRunner:
    """Measures one bench at a time (two would disturb each other's timings). Blocking; thread-safe."""

    def __init__(self, settings: BenchmarkRunnerSettings, models: ModelCache | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelCache(settings.bench_models)
        self._lock = threading.Lock()

    def measure(self, plan: BenchPlan, on_rep: RepCallback, done: Iterable[RepRow] = ()) -> BenchOutcome:
        """`measure.measure` with this host's device, dtype and thread budget."""
        with self._lock:
            # Worker threads start with PyTorch's default; the service's budget applies to each.
            torch.set_num_threads(self.settings.threads)
            return measure(
                plan,
                model_cache=self.models,
                on_rep=on_rep,
                done=done,
                device=self.settings.bench_device,
                dtype=self.settings.bench_dtype,
            )
