"""Targets kept loaded between jobs of a long-running process (a bench, a gate), shared by threads."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import torch

from speccore.errors import SpecError
from speccore.models import LoadedModel, load_model

ModelLoader = Callable[[str, str, str], LoadedModel]  # (model_ref, device, dtype) -> model


class ModelLoadError(SpecError):
    """A target could not be loaded (bad ref, missing files, out of memory)."""


def _load(model_ref: str, device: str, dtype: str) -> LoadedModel:
    return load_model(model_ref, device=device, dtype=dtype)


class ModelCache:
    """Targets kept loaded, least recently used dropped first. Thread-safe."""

    def __init__(self, capacity: int = 1, loader: ModelLoader = _load) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._loader = loader
        self._models: dict[tuple[str, str, str], LoadedModel] = {}
        self._lock = threading.Lock()

    def get(self, model_ref: str, device: str = "auto", dtype: str = "auto") -> LoadedModel:
        """The loaded target; ModelLoadError says why it cannot be loaded."""
        key = (model_ref, device, dtype)
        with self._lock:
            model = self._models.pop(key, None)
            if model is None:
                self._evict(self.capacity - 1)
                try:
                    model = self._loader(model_ref, device, dtype)
                except (SpecError, OSError, RuntimeError, MemoryError) as err:
                    raise ModelLoadError(f"cannot load target '{model_ref}': {err}") from err
            self._models[key] = model  # re-inserted last: most recently used
            return model

    def __len__(self) -> int:
        return len(self._models)

    def _evict(self, keep: int) -> None:
        while len(self._models) > keep:
            del self._models[next(iter(self._models))]
            release_memory()


def release_memory() -> None:
    """Hand freed tensors back (the CUDA cache too), e.g. after dropping a model or an engine."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
