"""Live workload summaries (issue 44): the engine server's rolling window per tenant
(services/engine/live_workload.py), what its request texts are, and the gateway's fingerprint
from a summary (runs.logic.accept_live)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from speccatalog.fingerprint.classifier import classify
from speccatalog.workloads import FINGERPRINTS
from specops_schemas.api import RunCreateBody
from specops_schemas.catalog import Fingerprint
from specops_schemas.serve import WorkloadSummarized
from specops_services.engine.live_workload import LiveWorkloads, SummaryPolicy, by_fingerprint
from specops_services.engine.live_workload_events import request_texts, summary_event
from specops_services.engine.protocol import ChatCompletionRequest, CompletionRequest
from specops_services.gateway.live_workload import LiveSummary
from specops_services.gateway.runs import logic

CODE = 'def mean(values: list[float]) -> float:\n    """Arithmetic mean."""\n'
CHAT = "What would you pack for a weekend by the sea?"
TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}


def test_agentic_counts_as_structured_and_every_fingerprint_is_kept() -> None:
    folded = by_fingerprint({"agentic": 0.5, "structured": 0.25, "code": 0.25})
    assert dict(zip(FINGERPRINTS, folded, strict=True)) == dict.fromkeys(FINGERPRINTS, 0.0) | {
        "structured": 0.75,
        "code": 0.25,
    }


def test_a_summary_is_due_every_k_requests_and_sums_the_last_n() -> None:
    windows = LiveWorkloads(SummaryPolicy(window=4, every=3))
    code, chat = classify([CODE, CHAT])
    due = [windows.observe("acme", code if i < 3 else chat, now=float(i)) for i in range(6)]
    assert [d is not None for d in due] == [False, False, True, False, False, True]
    first, last = due[2], due[5]
    assert first is not None and last is not None
    assert (first.requests, first.span_s, first.observed) == (3, 2.0, 3)
    assert max(first.probability_sums, key=first.probability_sums.__getitem__) == "code"
    # The window holds the last 4: one code request, three chat ones.
    assert (last.requests, last.span_s, last.observed) == (4, 3.0, 6)
    assert max(last.probability_sums, key=last.probability_sums.__getitem__) == "chat"
    assert sum(last.probability_sums.values()) == pytest.approx(4.0)


def test_tenants_have_windows_of_their_own_and_the_least_recent_is_forgotten() -> None:
    windows = LiveWorkloads(SummaryPolicy(window=8, every=1, max_tenants=2))
    [code] = classify([CODE])
    for tenant in ("acme", "globex", "acme", "initech"):
        summary = windows.observe(tenant, code, now=0.0)
        assert summary is not None and summary.tenant == tenant
    assert windows.summary("acme") is not None and windows.summary("acme").requests == 2  # type: ignore[union-attr]
    assert windows.summary("globex") is None  # the least recently seen of three, with room for two
    with pytest.raises(ValueError, match="at least 1"):
        SummaryPolicy(every=0)


def test_the_texts_of_a_request_and_the_event_carry_no_text() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CHAT}],
        }
    )
    assert request_texts(chat) == [f"Be brief.\n\n{CHAT}"]
    assert request_texts(CompletionRequest.model_validate({"model": "m", "prompt": [CODE, CHAT]})) == [
        CODE,
        CHAT,
    ]
    assert request_texts(CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]})) == []

    windows = LiveWorkloads(SummaryPolicy(every=1))
    summary = windows.observe("acme", classify([CODE])[0], now=0.0)
    assert summary is not None
    event = summary_event(summary, "srv-1", "smollm2-135m-instruct")
    assert event.subject == "spec.workload.acme.summarized" and event.tenant_id == "acme"
    assert "mean" not in event.to_json_bytes().decode()


def _live(sums: dict[str, float], requests: int) -> LiveSummary:
    summary = WorkloadSummarized(
        server_id="srv-1",
        tenant="acme",
        model_ref=TARGET["model_ref"],
        requests=requests,
        span_s=42.0,
        probability_sums=sums,  # type: ignore[arg-type]
        observed=requests,
    )
    return LiveSummary(summary, datetime(2026, 12, 2, tzinfo=UTC))


def test_the_gateway_takes_the_pooled_probabilities_argmax_from_a_live_summary() -> None:
    body = RunCreateBody.model_validate({"target": TARGET, "workload": {"fingerprint": "auto"}})
    # Four requests: three code-like, one between chat and rag.
    request = logic.accept_live(body, _live({"code": 3.0, "chat": 0.75, "rag": 0.25}, 4))
    workload = request.workload
    assert workload.fingerprint == Fingerprint.CODE
    inferred = workload.inferred
    assert inferred is not None and inferred.source == "live"
    assert (inferred.samples, inferred.window_s, inferred.confidence) == (4, 42.0, 0.75)
    assert (inferred.runner_up, inferred.runner_up_confidence) == (Fingerprint.CHAT, 0.1875)
    # A float sum of probabilities may pass the request count by a rounding: still a fraction.
    rounded = logic.accept_live(body, _live({"chat": 1.0000000002}, 1)).workload.inferred
    assert rounded is not None and rounded.confidence == 1.0 and rounded.runner_up_confidence == 0.0
