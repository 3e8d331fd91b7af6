"""Continuous batching: requests join and leave a running batch between steps.

A server hands requests to a :class:`ContinuousBatcher` and calls :meth:`step`
in one worker thread; each step admits waiting requests (up to ``max_rows``
running), runs one propose -> verify -> commit over every running row, and
reports each row's new tokens. Rows at different acceptance share a step: each
keeps its own accepted path. Not thread-safe: one thread owns the batcher.

Requests with different sampling parameters run in separate lanes (the
verifier takes one setting per batch), stepped in turn within one step. So do
requests decoded by different methods: a batcher may hold several engines over
one target (say, a head and the n-gram fallback a server switches to when the
head's acceptance drifts), and each request names its method when it is added.

Joining: the new rows are prefilled in a cache of their own, in groups of similar
prompt length (:func:`prefill_groups`), and the proposer is started on them alone;
then their KV cache and proposer state are appended to the lane's
(``Proposer.row_state``, ``speccore.rows``). Leaving: finished rows are cut out of
both, the last rows moved into their places (swap-remove: a row's index in the lane
changes, never its state). KV caches do both in place (kv_cache.py), so a
join or leave copies the rows that move, not the whole cache. The kernels are
row-invariant (``cpu_kernels``), so a request's tokens do not depend on which other
requests share its steps: greedy output equals the request decoded alone, and seeded
sampling draws the same tokens.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from speccore import rows
from speccore.engine import Batch, Engine, Generation, Request
from speccore.errors import SpecError
from speccore.sampling import SamplingParams

PREFILL_SLACK = 1.25
PREFILL_PAD = 16  # tokens


@dataclass(slots=True)
class RowUpdate:
    """What one step did for one request."""

    handle: int
    method: str  # the engine that decodes it (ContinuousBatcher.methods)
    tokens: list[int]  # the tokens kept this step (may be empty)
    drafted: int = 0  # draft nodes verified for this row this step
    accepted: int = 0  # draft tokens accepted (the bonus/recovered token not counted)
    finished: bool = False
    generation: Generation | None = None  # when finished: the whole result with its metrics


@dataclass(slots=True)
class StepReport:
    admitted: list[int] = field(default_factory=list)  # handles that joined the batch this step
    updates: list[RowUpdate] = field(default_factory=list)
    # (method, cap) per lane stepped with adaptive k: the draft nodes per row it allowed
    draft_caps: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class _Lane:
    """The running rows of one method and sampling setting: their batch, handles and proposer state."""

    engine: Engine
    batch: Batch
    handles: list[int]
    state: dict[str, Any]

    @property
    def row_state(self) -> tuple[str, ...]:
        proposer = self.engine.proposer
        return proposer.row_state if proposer is not None else ()


LaneKey = tuple[str, SamplingParams]


class ContinuousBatcher:
    def __init__(self, engines: Engine | Mapping[str, Engine], max_rows: int = 32) -> None:
        """``engines``: one engine, or several over the same target by method name (the
        first is the default method)."""
        if max_rows <= 0:
            raise SpecError(f"max_rows must be positive, got {max_rows}")
        self.engines = {engines.method: engines} if isinstance(engines, Engine) else dict(engines)
        if not self.engines:
            raise SpecError("a batcher needs an engine")
        if len({id(e.target) for e in self.engines.values()}) != 1:
            raise SpecError("every engine of one batcher must decode the same target")
        self.engine = next(iter(self.engines.values()))
        self.max_rows = max_rows
        self._handles = itertools.count(1)
        self._waiting: deque[tuple[int, str, Request]] = deque()
        self._cancelled: set[int] = set()
        self._lanes: dict[LaneKey, _Lane] = {}

    @property
    def methods(self) -> list[str]:
        return list(self.engines)

    def check(self, request: Request) -> None:
        """Raise SpecError if the request can never run (empty prompt, too long for the context).
        Reads only the request and the target: safe from any thread."""
        self.engine.check_request(request)

    def add(self, request: Request, method: str | None = None) -> int:
        """Queue a request (checked first) for ``method`` (default: the first); returns its handle."""
        method = method or self.engine.method
        if method not in self.engines:
            raise SpecError(f"no engine for method {method!r}; this batcher has {self.methods}")
        self.check(request)
        handle = next(self._handles)
        self._waiting.append((handle, method, request))
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
        for key in list(self._lanes):
            lane = self._lanes[key]
            report.updates += self._step_lane(key)
            if lane.batch.draft_cap is not None:
                report.draft_caps.append((key[0], lane.batch.draft_cap))
        return report

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        self._waiting = deque(item for item in self._waiting if item[0] not in self._cancelled)
        for key, lane in list(self._lanes.items()):
            keep = [i for i, h in enumerate(lane.handles) if h not in self._cancelled]
            if len(keep) < len(lane.handles):
                self._keep(key, lane, swap_remove(keep))
        live = {h for lane in self._lanes.values() for h in lane.handles} | {h for h, _, _ in self._waiting}
        self._cancelled &= live

    def _admit(self) -> list[int]:
        """Move waiting requests into their lanes, oldest first, while rows are free."""
        free = self.max_rows - self.running
        joining: dict[LaneKey, list[tuple[int, Request]]] = {}
        while self._waiting and free > 0:
            handle, method, request = self._waiting.popleft()
            joining.setdefault((method, request.sampling), []).append((handle, request))
            free -= 1
        for key, items in joining.items():
            self._join(key, items)
        return [h for items in joining.values() for h, _ in items]

    def _join(self, key: LaneKey, items: list[tuple[int, Request]]) -> None:
        for group in prefill_groups([len(r.prompt_ids) for _, r in items]):
            self._join_group(key, [items[i] for i in group])

    def _join_group(self, key: LaneKey, items: list[tuple[int, Request]]) -> None:
        engine = self.engines[key[0]]
        new = engine.open_batch([r for _, r in items])  # starts the proposer on these rows alone
        names = engine.proposer.row_state if engine.proposer is not None else ()
        fresh = rows.snapshot(engine.proposer, names)
        handles = [h for h, _ in items]
        lane = self._lanes.get(key)
        if lane is None:
            self._lanes[key] = _Lane(engine, new, handles, fresh)
            return
        old, added = len(lane.handles), len(handles)
        batch = lane.batch
        batch.seqs += new.seqs
        batch.requests += new.requests
        batch.metrics += new.metrics
        batch.starts += new.starts
        batch.cache = batch.cache.concat(new.cache)
        lane.handles += handles
        lane.state = {n: rows.concat(lane.state[n], fresh[n], old, added) for n in names}

    def _step_lane(self, key: LaneKey) -> list[RowUpdate]:
        lane = self._lanes[key]
        engine = lane.engine
        batch = lane.batch
        before = [
            (len(s.output_ids), m.drafted_tokens, m.accepted_tokens)
            for s, m in zip(batch.seqs, batch.metrics, strict=True)
        ]
        rows.restore(engine.proposer, lane.state)
        engine.step(batch)
        lane.state = rows.snapshot(engine.proposer, lane.row_state)
        updates = []
        for row, (seq, m, (n, drafted, accepted)) in enumerate(
            zip(batch.seqs, batch.metrics, before, strict=True)
        ):
            updates.append(
                RowUpdate(
                    handle=lane.handles[row],
                    method=key[0],
                    tokens=seq.output_ids[n:],
                    drafted=m.drafted_tokens - drafted,
                    accepted=m.accepted_tokens - accepted,
                    finished=seq.finished,
                    generation=engine.result(batch, row) if seq.finished else None,
                )
            )
        if any(s.finished for s in batch.seqs):
            self._keep(key, lane, swap_remove([i for i, s in enumerate(batch.seqs) if not s.finished]))
        return updates

    def _keep(self, key: LaneKey, lane: _Lane, keep: list[int]) -> None:
        """Cut the lane down to these rows (all state moves with them); an empty lane goes."""
        if not keep:
            del self._lanes[key]
            return
        batch = lane.batch
        batch.seqs = [batch.seqs[i] for i in keep]
        batch.requests = [batch.requests[i] for i in keep]
        batch.metrics = [batch.metrics[i] for i in keep]
        batch.starts = [batch.starts[i] for i in keep]
        batch.cache = batch.cache.take(keep)
        lane.handles = [lane.handles[i] for i in keep]
        lane.state = {n: rows.take(v, keep) for n, v in lane.state.items()}


def prefill_groups(lengths: list[int]) -> list[list[int]]:
    """The joining rows (by prompt length) in groups prefilled together, shortest first: a
    group's longest prompt is at most PREFILL_SLACK times its shortest plus PREFILL_PAD, so
    padding wastes little (one padded prefill of a 270-token prompt with 30 of 50 tokens
    computes 8,100 positions for 1,800 real ones)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if groups and lengths[i] <= lengths[groups[-1][0]] * PREFILL_SLACK + PREFILL_PAD:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def swap_remove(alive: list[int]) -> list[int]:
    """The order that keeps the rows ``alive`` (ascending) by moving the last ones into the
    holes: slot j keeps its row when alive, else takes a live row from beyond the new end."""
    live, n = set(alive), len(alive)
    tail = [i for i in alive if i >= n]
    return [j if j in live else tail.pop() for j in range(n)]
