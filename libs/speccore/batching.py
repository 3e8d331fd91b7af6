"""Continuous batching: requests join and leave a running batch between steps.

A server hands requests to a :class:`ContinuousBatcher` and calls :meth:`step`
in one worker thread; each step admits waiting requests (up to ``max_rows``
running), runs one propose -> verify -> commit over every running row, and
reports each row's new tokens. Rows at different acceptance share a step: each
keeps its own accepted path. Not thread-safe: one thread owns the batcher.

Requests with different sampling parameters run in separate lanes (the
verifier takes one setting per batch), stepped in turn within one step.

Joining: the new rows are prefilled in a cache of their own and the proposer is
started on them alone; then their KV cache and proposer state are appended to the
lane's (``Proposer.row_state``, ``speccore.rows``). Leaving: finished rows are
cut out of both. The kernels are row-invariant (``cpu_kernels``), so a request's
tokens do not depend on which other requests share its steps: greedy output equals
the request decoded alone, and seeded sampling draws the same tokens.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from speccore import rows
from speccore.engine import Batch, Engine, Generation, Request
from speccore.errors import SpecError
from speccore.sampling import SamplingParams


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


@dataclass(slots=True)
class _Lane:
    """The running rows of one sampling setting: their batch, handles and proposer state."""

    batch: Batch
    handles: list[int]
    state: dict[str, Any]


class ContinuousBatcher:
    def __init__(self, engine: Engine, max_rows: int = 32) -> None:
        if max_rows <= 0:
            raise SpecError(f"max_rows must be positive, got {max_rows}")
        self.engine = engine
        self.max_rows = max_rows
        self._handles = itertools.count(1)
        self._waiting: deque[tuple[int, Request]] = deque()
        self._cancelled: set[int] = set()
        self._lanes: dict[SamplingParams, _Lane] = {}
        proposer = engine.proposer
        self._row_state: tuple[str, ...] = proposer.row_state if proposer is not None else ()

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
        """Drop a request: waiting, it never runs; running, it leaves before the next step."""
        self._cancelled.add(handle)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(len(lane.handles) for lane in self._lanes.values())

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._lanes

    @torch.inference_mode()
    def step(self) -> StepReport:
        """Admit waiting requests, run one step of every lane, retire the finished rows."""
        report = StepReport()
        self._drop_cancelled()
        report.admitted = self._admit()
        for sampling in list(self._lanes):
            report.updates += self._step_lane(sampling)
        return report

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        self._waiting = deque((h, r) for h, r in self._waiting if h not in self._cancelled)
        for sampling, lane in list(self._lanes.items()):
            keep = [i for i, h in enumerate(lane.handles) if h not in self._cancelled]
            if len(keep) < len(lane.handles):
                self._keep(sampling, lane, keep)
        live = {h for lane in self._lanes.values() for h in lane.handles} | {h for h, _ in self._waiting}
        self._cancelled &= live

    def _admit(self) -> list[int]:
        """Move waiting requests into their lanes, oldest first, while rows are free."""
        free = self.max_rows - self.running
        joining: dict[SamplingParams, list[tuple[int, Request]]] = {}
        while self._waiting and free > 0:
            handle, request = self._waiting.popleft()
            joining.setdefault(request.sampling, []).append((handle, request))
            free -= 1
        for sampling, items in joining.items():
            self._join(sampling, items)
        return [h for items in joining.values() for h, _ in items]

    def _join(self, sampling: SamplingParams, items: list[tuple[int, Request]]) -> None:
        new = self.engine.open_batch([r for _, r in items])  # starts the proposer on these rows alone
        fresh = rows.snapshot(self.engine.proposer, self._row_state)
        handles = [h for h, _ in items]
        lane = self._lanes.get(sampling)
        if lane is None:
            self._lanes[sampling] = _Lane(new, handles, fresh)
            return
        old, added = len(lane.handles), len(handles)
        batch = lane.batch
        batch.seqs += new.seqs
        batch.requests += new.requests
        batch.metrics += new.metrics
        batch.starts += new.starts
        batch.cache = batch.cache.concat(new.cache)
        lane.handles += handles
        lane.state = {n: rows.concat(lane.state[n], fresh[n], old, added) for n in self._row_state}

    def _step_lane(self, sampling: SamplingParams) -> list[RowUpdate]:
        lane = self._lanes[sampling]
        batch = lane.batch
        before = [
            (len(s.output_ids), m.drafted_tokens, m.accepted_tokens)
            for s, m in zip(batch.seqs, batch.metrics, strict=True)
        ]
        rows.restore(self.engine.proposer, lane.state)
        self.engine.step(batch)
        lane.state = rows.snapshot(self.engine.proposer, self._row_state)
        updates = []
        for row, (seq, m, (n, drafted, accepted)) in enumerate(
            zip(batch.seqs, batch.metrics, before, strict=True)
        ):
            updates.append(
                RowUpdate(
                    handle=lane.handles[row],
                    tokens=seq.output_ids[n:],
                    drafted=m.drafted_tokens - drafted,
                    accepted=m.accepted_tokens - accepted,
                    finished=seq.finished,
                    generation=self.engine.result(batch, row) if seq.finished else None,
                )
            )
        if any(s.finished for s in batch.seqs):
            self._keep(sampling, lane, [i for i, s in enumerate(batch.seqs) if not s.finished])
        return updates

    def _keep(self, sampling: SamplingParams, lane: _Lane, keep: list[int]) -> None:
        """Cut the lane down to these rows (all state moves with them); an empty lane goes."""
        if not keep:
            del self._lanes[sampling]
            return
        batch = lane.batch
        batch.seqs = [batch.seqs[i] for i in keep]
        batch.requests = [batch.requests[i] for i in keep]
        batch.metrics = [batch.metrics[i] for i in keep]
        batch.starts = [batch.starts[i] for i in keep]
        batch.cache = batch.cache.take(keep)
        lane.handles = [lane.handles[i] for i in keep]
        lane.state = {n: rows.take(v, keep) for n, v in lane.state.items()}
