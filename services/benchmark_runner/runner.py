"""The runner's one blocking call: measure a plan on the cached target.

`BenchRunner.measure` blocks for as long as the bench takes (minutes on a CPU); the
app calls it in a worker thread. The target stays loaded between benches (ModelCache).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from speccore.model_cache import ModelCache
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.measure import BenchOutcome, RepCallback, RepRow, measure
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings


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
