"""The I/O side of live workload summaries (live_workload.py decides): requests' prompts handed
off the request path, classified on a thread of their own, and each due summary logged and
published on `spec.workload.<tenant>.summarized` (specops_schemas.serve.WorkloadSummarized).

A prompt's text lives only in the hand-off queue until the thread classifies it: the window
keeps its eight probabilities, and what leaves the server is their sums per tenant. The queue is
bounded (``QUEUE``): in a burst beyond what the thread classifies (a few milliseconds a prompt),
requests are left out of the summary rather than held, and counted in ``dropped``. Requests
without a tenant claim (the reserved ``default`` tenant) are not summarized: no tenant's run
could ask for them. A completion's prompts given as token ids have no text and are left out.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from specbus.envelope import Envelope, new_event
from speccatalog.fingerprint import sample_text
from speccatalog.fingerprint.classifier import classify
from specops_schemas.serve import WorkloadSummarized
from specops_services.engine.bus import PRODUCER, EngineBus
from specops_services.engine.live_workload import LiveWorkloads, Summary, SummaryPolicy
from specops_services.engine.protocol import ChatCompletionRequest, CompletionRequest
from specplatform.tenant_signature import UNCLAIMED_TENANT

log = logging.getLogger(__name__)

QUEUE = 1024  # requests waiting to be classified; more are left out


def request_texts(body: CompletionRequest | ChatCompletionRequest) -> list[str]:
    """The texts a request's prompts are: one per prompt string, the messages' contents as one."""
    if isinstance(body, ChatCompletionRequest):
        return [sample_text([{"content": m.text()} for m in body.messages])]
    if isinstance(body.prompt, str):
        return [body.prompt]
    return [p for p in body.prompt if isinstance(p, str)]


def summary_event(summary: Summary, server_id: str, model_ref: str) -> Envelope[Any]:
    payload = WorkloadSummarized(
        server_id=server_id,
        tenant=summary.tenant,
        model_ref=model_ref,
        requests=summary.requests,
        span_s=summary.span_s,
        probability_sums=summary.probability_sums,  # type: ignore[arg-type]
        observed=summary.observed,
    )
    return new_event(payload, tenant_id=summary.tenant, correlation_id=server_id, producer=PRODUCER)


class LiveWorkloadReporter:
    """Takes requests' texts from any thread; classifies, folds and publishes on its own."""

    def __init__(self, policy: SummaryPolicy, server_id: str, model_ref: str, bus: EngineBus | None) -> None:
        self.workloads = LiveWorkloads(policy)
        self.server_id = server_id
        self.model_ref = model_ref
        self.bus = bus
        self.dropped = 0
        self._inbox: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=QUEUE)  # None: stop
        self._thread = threading.Thread(target=self._run, name="live-workload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def offer(self, tenant: str, texts: list[str]) -> None:
        """A served request's prompts; returns at once (left out when the queue is full)."""
        if tenant == UNCLAIMED_TENANT:
            return
        for text in texts:
            try:
                self._inbox.put_nowait((tenant, text))
            except queue.Full:
                self.dropped += 1

    def _run(self) -> None:
        while (item := self._inbox.get()) is not None:
            tenant, text = item
            try:
                [probabilities] = classify([text])
                summary = self.workloads.observe(tenant, probabilities, time.monotonic())
                if summary is not None:
                    self._report(summary)
            except Exception:  # a summary is best effort; serving goes on
                log.exception("could not summarize a request of tenant %s", tenant)

    def _report(self, summary: Summary) -> None:
        top = max(summary.probability_sums.items(), key=lambda item: item[1])
        log.info(
            "live workload of tenant %s: %d requests over %.0f s, %s %.2f (%d left out so far)",
            summary.tenant,
            summary.requests,
            summary.span_s,
            top[0],
            top[1] / summary.requests,
            self.dropped,
        )
        if self.bus is not None:
            self.bus.publish(summary_event(summary, self.server_id, self.model_ref))
