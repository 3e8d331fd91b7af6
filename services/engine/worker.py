"""The one thread that owns the continuous batcher.

`speccore.batching.ContinuousBatcher` is not thread-safe, so a single worker thread adds,
cancels and steps; the HTTP side (asyncio) reaches it only through a thread-safe inbox
(`submit`, `cancel`, `stop`). Each request names a sink, a callable the worker hands its
updates to (the app's sink puts them on the request's asyncio.Queue with
`loop.call_soon_threadsafe`).

An update carries the tokens a step kept for the row: every step with a batcher that steps
rows one verify step at a time, or all of them in the finishing update with one that runs
a row to its end; the worker and the HTTP side handle both alike. The worker also keeps the
metrics (metrics.py): it is where admission, delivery and finishing happen.

With drift control (drift_events.DriftControl) the worker also picks each request's method
as it adds it (the primary, or the fallback of a key whose acceptance drifted) and tells it
what each finished request measured. A request whose tenant opted out of speculation (F-S3,
``Ticket.plain``) always goes to plain decoding and is never shown to drift control.

While idle the worker blocks on the inbox; while rows run it drains the inbox between
steps, so new requests join at the next step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from speccore.batching import ContinuousBatcher, RowUpdate
from speccore.engine import Request
from speccore.errors import SpecError
from speccore.proposers import NONE as PLAIN
from specops_services.engine.drift import DriftKey
from specops_services.engine.drift_events import DriftControl
from specops_services.engine.logic import SpecCounts, update_counts
from specops_services.engine.metrics import EngineMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tokens:
    """New tokens of one choice; ``finish_reason`` (stop, length) set on its last update."""

    index: int
    tokens: list[int]
    finish_reason: str | None = None
    cached_prompt_tokens: int | None = None  # on the last update: of its prompt, from the prefix cache


@dataclass(frozen=True, slots=True)
class Failed:
    """The choice cannot finish: refused by the batcher, or the server is stopping."""

    index: int
    message: str


Event = Tokens | Failed
Sink = Callable[[Event], None]


@dataclass(slots=True, eq=False)
class Ticket:
    """One choice's request as the worker tracks it."""

    index: int  # the choice's index in its HTTP response
    request: Request
    sink: Sink
    arrival: float  # time.monotonic() when the HTTP request arrived
    handle: int | None = None  # the batcher's, once added
    last_delivery: float | None = None
    delivered: int = 0  # tokens handed to the sink
    counted: SpecCounts = field(default_factory=SpecCounts)
    key: DriftKey = field(default_factory=DriftKey)  # tenant and workload, for drift
    method: str | None = None  # the engine that decodes it, once added
    plain: bool = False  # F-S3: its tenant opted out of speculation; plain decoding only


@dataclass(frozen=True, slots=True)
class _Cancel:
    ticket: Ticket


_STOP = object()


class EngineWorker:
    def __init__(
        self, batcher: ContinuousBatcher, metrics: EngineMetrics, drift: DriftControl | None = None
    ) -> None:
        self.batcher = batcher
        self.metrics = metrics
        self.drift = drift  # None: every request goes to the batcher's first method
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._live: dict[int, Ticket] = {}  # batcher handle -> ticket
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)

    # --- the HTTP side (any thread) ---------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(
        self,
        index: int,
        request: Request,
        sink: Sink,
        arrival: float,
        key: DriftKey | None = None,
        *,
        plain: bool = False,
    ) -> Ticket:
        ticket = Ticket(
            index=index, request=request, sink=sink, arrival=arrival, key=key or DriftKey(), plain=plain
        )
        self._inbox.put(ticket)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop a request (its client went away); no further updates reach its sink."""
        self._inbox.put(_Cancel(ticket))

    def stop(self, timeout: float | None = None) -> None:
        """Finish the step under way, fail what is still queued or running, and join the thread."""
        self._inbox.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the engine worker is still in a step after %s s; leaving it", timeout)
        else:
            log.info("the engine worker stopped")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._drain(block=self.batcher.idle):
                if not self.batcher.idle:
                    try:
                        self._step()
                    except Exception as exc:  # the batch's requests fail; the server goes on
                        log.exception("a decoding step failed; failing the requests in the batch")
                        self._fail_live(f"the engine failed: {type(exc).__name__}: {exc}")
                self.metrics.queues(running=self.batcher.running, waiting=self.batcher.waiting)
        finally:
            self._fail_live("the server is shutting down")
            self._fail_inbox("the server is shutting down")
            self.metrics.queues(running=0, waiting=0)

    def _drain(self, *, block: bool) -> bool:
        """Take what the inbox holds (waiting for one item if ``block``); False once told to stop."""
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if item is _STOP:
                return False
            if isinstance(item, Ticket):
                self._add(item)
            elif isinstance(item, _Cancel):
                self._cancel(item.ticket)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, ticket: Ticket) -> None:
        if ticket.plain:
            ticket.method = PLAIN
        else:
            ticket.method = self.drift.route(ticket.key) if self.drift is not None else None
        try:
            ticket.handle = self.batcher.add(ticket.request, ticket.method)
        except SpecError as exc:
            self._send(ticket, Failed(ticket.index, str(exc)))
            return
        self._live[ticket.handle] = ticket

    def _cancel(self, ticket: Ticket) -> None:
        if ticket.handle is None or self._live.pop(ticket.handle, None) is None:
            return
        self.batcher.cancel(ticket.handle)
        self.metrics.finished("abort", None)

    def _step(self) -> None:
        # Admission happens as the step starts: the time before it is the admission time.
        started = time.monotonic()
        report = self.batcher.step()
        delivered = time.monotonic()
        for _, cap in report.draft_caps:
            self.metrics.draft_cap(cap)
        for handle in report.admitted:
            ticket = self._live.get(handle)
            if ticket is not None:
                self.metrics.admitted(len(ticket.request.prompt_ids), started - ticket.arrival)
        for update in report.updates:
            ticket = self._live.get(update.handle)
            if ticket is not None:
                self._deliver(ticket, update, delivered)

    def _deliver(self, ticket: Ticket, update: RowUpdate, now: float) -> None:
        gen = update.generation if update.finished else None
        counts = update_counts(
            ticket.counted,
            drafted=update.drafted,
            accepted=update.accepted,
            finished_with=gen.metrics if gen is not None else None,
        )
        ticket.counted.add(counts)
        self.metrics.spec(counts)
        since_last = now - ticket.last_delivery if ticket.last_delivery is not None else None
        if update.tokens:
            self.metrics.delivered(
                len(update.tokens), since_arrival_s=now - ticket.arrival, since_last_s=since_last
            )
            ticket.last_delivery = now
            ticket.delivered += len(update.tokens)
        reason = None
        if update.finished:
            reason = gen.finish_reason if gen is not None else "length"
            del self._live[update.handle]
            self.metrics.finished(reason, now - ticket.arrival)
            if self.drift is not None and not ticket.plain:
                self.drift.finished(ticket.key, update.method, ticket.counted)
            self._log_finished(ticket, reason)
        if update.tokens or update.finished:
            cached = gen.metrics.cached_prompt_tokens if gen is not None else None
            self._send(ticket, Tokens(ticket.index, list(update.tokens), reason, cached))

    def _send(self, ticket: Ticket, event: Event) -> None:
        try:
            ticket.sink(event)
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            if ticket.handle is not None and self._live.pop(ticket.handle, None) is not None:
                self.batcher.cancel(ticket.handle)

    def _fail_live(self, message: str) -> None:
        """Fail and cancel every request the batcher holds, running or waiting."""
        for handle, ticket in list(self._live.items()):
            self.batcher.cancel(handle)
            self._send(ticket, Failed(ticket.index, message))
            self.metrics.finished("abort", None)
        self._live.clear()

    def _fail_inbox(self, message: str) -> None:
        """Fail the requests submitted but never added."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Ticket):
                self._send(item, Failed(item.index, message))

    def _log_finished(self, ticket: Ticket, reason: str) -> None:
        """The request's own spec-decode counts, which /metrics only shows summed."""
        c = ticket.counted
        rate = c.accepted / c.draft_tokens if c.draft_tokens else 0.0
        mal = 1 + c.accepted / c.drafts if c.drafts else 1.0
        log.info(
            "request %d finished (%s) by %s for tenant %s, workload %s: %d prompt + %d generated tokens, "
            "%d drafts, %d draft tokens, %d accepted (acceptance %.2f, mean acceptance length %.2f), %.3f s",
            ticket.handle,
            reason,
            ticket.method or self.batcher.engine.method,
            ticket.key.tenant,
            ticket.key.workload,
            len(ticket.request.prompt_ids),
            ticket.delivered,
            c.drafts,
            c.draft_tokens,
            c.accepted,
            rate,
            mal,
            time.monotonic() - ticket.arrival,
        )
