"""Continuous batching: requests join and leave a running batch between steps.

A server hands requests to a :class:`ContinuousBatcher` and calls :meth:`step`
in one worker thread; each step admits waiting requests (up to ``max_rows``
running), runs one propose -> verify -> commit over every running row, and
reports each row's new tokens. Rows at different acceptance share a step: each
keeps its own accepted path. Not thread-safe: one thread owns the batcher.

Requests with different sampling parameters run in separate batches (the
verifier takes one setting per batch), stepped in turn.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from speccore.engine import Engine, Generation, Request
from speccore.errors import SpecError


@dataclass(slots=True)
class RowUpdate:
    """What one step did for one request."""

    handle: int
    tokens: list[int]  # the tokens kept this step (may be empty)
    drafted: int = 0  # draft nodes verified for this row this step
    accepted: int = 0  # draft tokens accepted (the bonus/recovered token not counted)
    finished: bool = False
    generation: Generation | None = None  # when finished: the whole result with its metrics


@dataclass(slots=True)
class StepReport:
    admitted: list[int] = field(default_factory=list)  # handles that joined the batch this step
    updates: list[RowUpdate] = field(default_factory=list)


class ContinuousBatcher:
    def __init__(self, engine: Engine, max_rows: int = 32) -> None:
        if max_rows <= 0:
            raise SpecError(f"max_rows must be positive, got {max_rows}")
        self.engine = engine
        self.max_rows = max_rows
        self._handles = itertools.count(1)
        self._waiting: deque[tuple[int, Request]] = deque()
        self._cancelled: set[int] = set()

    def check(self, request: Request) -> None:
        """Raise SpecError if the request can never run (empty prompt, too long for the context)."""
        self.engine.check_request(request)

    def add(self, request: Request) -> int:
        """Queue a request (checked first); returns its handle."""
        self.check(request)
        handle = next(self._handles)
        self._waiting.append((handle, request))
        return handle

    def cancel(self, handle: int) -> None:
        """Drop a request: waiting, it never runs; running, it leaves at the next step."""
        self._cancelled.add(handle)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return 0

    @property
    def idle(self) -> bool:
        return not self._waiting

    def step(self) -> StepReport:
        """Interim: runs the waiting requests of one sampling setting to the end as one batch."""
        report = StepReport()
        if not self._waiting:
            return report
        sampling = self._waiting[0][1].sampling
        wave = [(h, r) for h, r in self._waiting if r.sampling == sampling][: self.max_rows]
        for item in wave:
            self._waiting.remove(item)
        wave = [(h, r) for h, r in wave if h not in self._cancelled]
        if not wave:
            return report
        report.admitted = [h for h, _ in wave]
        results = self.engine.generate([r for _, r in wave])
        for (handle, _), gen in zip(wave, results, strict=True):
            report.updates.append(
                RowUpdate(
                    handle=handle,
                    tokens=list(gen.token_ids),
                    drafted=gen.metrics.drafted_tokens,
                    accepted=gen.metrics.accepted_tokens,
                    finished=True,
                    generation=gen,
                )
            )
        return report
