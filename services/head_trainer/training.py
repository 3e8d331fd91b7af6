"""The trainer's one blocking call: train a head on the cached target, under the device lock,
then write an EAGLE-3 head's speculators export beside it (the layout vLLM loads).

`HeadTrainer.train` blocks for as long as training takes (minutes to hours); the app
calls it in a worker thread. The target stays loaded between heads (ModelCache). While
it trains it holds the device's host lock (specplatform.hostlock), the one the
benchmark-runner and the quality gate measure under, so training never skews a
measurement on the same host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import torch

from specbus.envelope import Envelope
from speccore.errors import SpecError
from speccore.heads.speculators import export_for_target
from speccore.model_cache import ModelCache, ModelLoadError
from speccore.models import LoadedModel
from speccore.training.run import HeadPlan, hardware, train_head
from speccore.training.trainer import EpochReport
from specops_schemas.catalog import ErrorStage
from specops_schemas.heads import HeadRequested
from specops_services.head_trainer import logic, store
from specops_services.head_trainer.logic import Failure
from specops_services.head_trainer.settings import HeadTrainerSettings
from specplatform.hostlock import DeviceLock, device_lock_name

# (resumed_from_step or None, hardware) once the target is loaded and training begins.
OnStarted = Callable[[int | None, str], None]
OnEpoch = Callable[[EpochReport], None]


class Stopped(Exception):
    """The service is shutting down: training stops at its next epoch (its checkpoint stays)."""


class HeadTrainer:
    """Trains one head at a time per device and host. Blocking; thread-safe."""

    def __init__(self, settings: HeadTrainerSettings, models: ModelCache | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelCache(settings.head_models)
        self.device_lock = DeviceLock(settings.measure_lock_dir, device_lock_name(settings.head_device))

    @property
    def root(self) -> Path:
        return self.settings.artifact_root

    def train(
        self,
        event: Envelope[HeadRequested],
        plan: HeadPlan,
        data: Path,
        heldout: Path | None,
        on_started: OnStarted,
        on_epoch: OnEpoch,
        stop: threading.Event | None = None,
    ) -> Path | Failure:
        """Train (or resume) the head into its work dir; the work dir, or why it failed.

        Waits for the device lock first; `stop` set meanwhile raises LockAbandoned.
        """
        head_id, request = event.payload.head_id, event.payload.request
        work = store.work_dir(self.root, event.tenant_id, head_id)
        verifier = logic.speculators_verifier(request.family, request.target)
        # Trained, then killed before the move (or before its export was written).
        finished = store.finished_in(work, head_id)
        if finished and (verifier is None or store.exported(work)):
            return work
        # The target's load is inside the lock too: it loads the cores as much as training does.
        with self.device_lock.held(f"training of head {head_id}", stop):
            torch.set_num_threads(self.settings.threads)
            try:
                target = self.models.get(request.target, self.settings.head_device, self.settings.head_dtype)
            except ModelLoadError as err:
                return Failure(ErrorStage.MODEL_LOAD, str(err))
            if not finished:
                on_started(store.checkpoint_step(work), hardware(target))

                def report(epoch: EpochReport) -> None:
                    on_epoch(epoch)
                    if stop is not None and stop.is_set():
                        raise Stopped

                try:
                    train_head(target, plan, data, heldout, work, report, progress=False)
                except SpecError as err:
                    return Failure(ErrorStage.TRAINING, str(err))
            if verifier is not None:
                try:
                    store.write_export(work, lambda out: export_head(work, out, target, verifier))
                except SpecError as err:
                    return Failure(ErrorStage.TRAINING, f"the speculators export failed: {err}")
        return work


def export_head(head: Path, out: Path, target: LoadedModel, verifier: str) -> Path:
    """The trained head in the speculators layout, for vLLM runs of its target."""
    return export_for_target(head, out, target.model, verifier, speculative_tokens=logic.SPECULATORS_K)
