"""Shared fixtures: the real offline models, loaded once per session."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning
# threads of one process starve the other (a 5x slowdown was measured).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from speccore.models import LoadedModel, engine_checkpoint, load_model  # noqa: E402

# Real servers for the service and integration tests, the bus helpers' `js`, the spans a
# test's process traced, and no logging handler left on a stream pytest closes (tests/fixtures/).
pytest_plugins = [
    "fixtures.logging_guard",
    "fixtures.nats",
    "fixtures.postgres",
    "fixtures.bus",
    "fixtures.runtime",
    "fixtures.tracing",
]

# `make test` runs two pytest-xdist workers on the 2-core host: one thread each then, so the
# workers share the cores instead of four threads contending for two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> str:
    """smollm2's dequantized directory: what vLLM loads for the offline alias."""
    return engine_checkpoint("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm_bf16() -> LoadedModel:
    return load_model("smollm2-135m-instruct", device="cpu", dtype="bfloat16")


@pytest.fixture(scope="session")
def gemma() -> LoadedModel:
    return load_model("gemma-3-270m", device="cpu", dtype="float32")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tests/integration: the whole runtime end to end, test by test (a minute or more each).
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.long)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
