"""Shared fixtures: the real offline models, loaded once per session."""

from __future__ import annotations

import pytest
import torch

from speccore.models import LoadedModel, load_model

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def gemma() -> LoadedModel:
    return load_model("gemma-3-270m", device="cpu", dtype="float32")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
