"""The engine server's worker thread over the real batcher and smollm2: a step that raises
fails the requests in its batch and the worker serves the next; stopping it joins the thread."""

from __future__ import annotations

import queue
import time

import pytest

from speccore.batching import ContinuousBatcher, StepReport
from speccore.engine import Engine, Request
from speccore.models import LoadedModel
from speccore.proposers.base import ProposerConfig
from specops_services.engine.metrics import EngineMetrics
from specops_services.engine.worker import EngineWorker, Event, Failed, Tokens

pytestmark = pytest.mark.slow

WAIT_S = 120.0


def test_a_failing_step_fails_its_requests_and_the_worker_goes_on(smollm: LoadedModel) -> None:
    batcher = ContinuousBatcher(Engine(smollm, "none"), max_rows=4)
    steps = 0
    real_step = batcher.step

    def step() -> StepReport:
        nonlocal steps
        steps += 1
        if steps == 1:
            raise RuntimeError("out of memory")
        return real_step()

    batcher.step = step  # type: ignore[method-assign]
    worker = EngineWorker(batcher, EngineMetrics("smollm"))
    events: queue.Queue[Event] = queue.Queue()
    request = Request(smollm.encode_prompt("The capital of France is", chat=False), 6)
    worker.start()
    try:
        worker.submit(0, request, events.put, time.monotonic())
        failed = events.get(timeout=WAIT_S)
        assert isinstance(failed, Failed) and "RuntimeError: out of memory" in failed.message

        worker.submit(0, request, events.put, time.monotonic())
        tokens = _tokens_until_finished(events)
        assert tokens == Engine(smollm, "none").generate([request])[0].token_ids
    finally:
        worker.stop(WAIT_S)
    assert not worker.alive


def _tokens_until_finished(events: queue.Queue[Event]) -> list[int]:
    """One choice's tokens as the worker delivers them, up to its finishing update."""
    tokens: list[int] = []
    while True:
        event = events.get(timeout=WAIT_S)
        assert isinstance(event, Tokens)
        tokens += event.tokens
        if event.finish_reason is not None:
            return tokens


def test_adaptive_k_caps_reach_the_metrics(smollm: LoadedModel) -> None:
    engine = Engine(smollm, "ngram", ProposerConfig(k=4), adaptive=True)
    metrics = EngineMetrics("smollm")
    worker = EngineWorker(ContinuousBatcher(engine, max_rows=4), metrics)
    events: queue.Queue[Event] = queue.Queue()
    request = Request(smollm.encode_prompt("1, 2, 3, 4, 5,", chat=False), 12)
    worker.start()
    try:
        worker.submit(0, request, events.put, time.monotonic())
        tokens = _tokens_until_finished(events)
    finally:
        worker.stop(WAIT_S)
    assert tokens == Engine(smollm, "none").generate([request])[0].token_ids
    labels = {"model_name": "smollm"}
    steps = metrics.registry.get_sample_value("specops:spec_decode_adaptive_k_count", labels)
    assert engine.adaptive is not None
    assert steps == engine.adaptive.steps > 0  # one observation per step, each a cap in 0..k_max
    assert (
        metrics.registry.get_sample_value("specops:spec_decode_adaptive_k_bucket", labels | {"le": "4.0"})
        == steps
    )
