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
from specops_services.benchmark_runner.measure import Corpora, measure
from specops_services.benchmark_runner.measure_http import http_engine, measure_http
from specops_services.benchmark_runner.protocol import BenchOutcome, RepCallback, RepRow
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specplatform.hostlock import DeviceLock, device_lock_name


class BenchRunner:
    """Measures one bench at a time per device and host, whichever replica or process runs it
    (two would disturb each other's timings): it holds the device's host lock
    (specplatform.hostlock) while it measures. Blocking; thread-safe."""

    def __init__(self, settings: BenchmarkRunnerSettings, models: ModelCache | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelCache(settings.bench_models)
        self.device_lock = DeviceLock(settings.measure_lock_dir, device_lock_name(settings.bench_device))

    def measure(
        self,
        plan: BenchPlan,
        on_rep: RepCallback,
        done: Iterable[RepRow] = (),
        stop: threading.Event | None = None,
        *,
        tenant_id: str | None = None,
    ) -> BenchOutcome:
        """`measure.measure` with this host's device, dtype, thread budget and artifact store
        (`tenant_id`: the bench's tenant, whose uploaded corpora its rest candidates may name);
        `measure_http.measure_http` on engine servers for a vLLM or SGLang plan, and for a
        speccore one when `bench_speccore` is `server`.

        Waits for the device lock first; `stop` set meanwhile raises LockAbandoned.
        """
        # The target's load is inside the lock too: it loads the cores as much as a rep does.
        with self.device_lock.held(f"bench of run {plan.run_id}", stop):
            # Worker threads start with PyTorch's default; the service's budget applies to each.
            torch.set_num_threads(self.settings.threads)
            engine = http_engine(plan, self.settings)
            if engine is not None:
                corpora = Corpora(tenant_id, self.settings.artifact_root)
                return measure_http(plan, engine, self.settings, on_rep=on_rep, done=done, corpora=corpora)
            return measure(
                plan,
                model_cache=self.models,
                on_rep=on_rep,
                done=done,
                device=self.settings.bench_device,
                dtype=self.settings.bench_dtype,
                tenant_id=tenant_id,
                artifact_root=self.settings.artifact_root,
            )
