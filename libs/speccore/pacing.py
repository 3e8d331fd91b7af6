"""F-S2: release accepted tokens on a fixed clock, so their timing does not say how many
each verify step accepted (the acceptance-pattern side channel, issue 20).

Speculative decoding emits a step's accepted tokens together: over an encrypted stream the
burst sizes (and the gaps between bursts) follow the acceptance, and acceptance follows the
text being generated. Three ways to hide it, and what each still leaks:

- **Padding** (send dummy bytes or empty events to even out sizes): a step's tokens still
  leave together, so the gaps between bursts keep the acceptance pattern.
- **Random jitter** (a random delay per burst): the noise averages out over the tokens of
  one stream; bursts stay visible, the attacker needs a few more tokens.
- **Pacing to the request's own rate** (tokens spread evenly over the time the generation
  took): hides the bursts but not the total duration, whose mean rate is the acceptance.
- **A fixed pace** (one token per ``interval``, the same for every request): the arrival
  time of token i is the first token's time plus i x interval, whatever was accepted when.
  Burst sizes and the total duration both stop depending on acceptance; what remains is the
  number of tokens (which an encrypted stream shows anyway) and the time to the first token
  (prefill and one step: the prompt's length, not the acceptance).

We pace at a fixed interval. Its cost is latency, not compute: the engine still decodes as
fast as it can (its rows leave the batch as early as before, so the server's throughput under
load is unchanged); the caller reads at most one token per ``interval``. The interval must be
at least the engine's slowest step per token (the plain decoding step under load): a token
that is not there at its slot waits for the first later slot on the same grid
(:attr:`PaceClock.slips` counts it), so a slip shows only how many slots were missed, never
the engine's own time. The end of a choice (its finish
reason) takes a slot of its own, so a finishing update that keeps no token is paced too.

Pure: times are whatever clock the caller reads (the server's ``loop.time()``); this module
only computes the schedule.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class PaceClock:
    """One stream's clock: the slot of each release, ``interval_s`` apart from the first."""

    interval_s: float
    next_at: float | None = None  # the next free slot; None before the first release
    slips: int = 0  # releases that waited for their token past their slot

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"the pace interval must be positive, got {self.interval_s}")

    def slot(self, available_at: float) -> float:
        """When a release that is ready at ``available_at`` goes out; the clock moves on."""
        if self.next_at is None:
            at = available_at
        elif available_at > self.next_at:
            missed = math.ceil((available_at - self.next_at) / self.interval_s)
            at = self.next_at + missed * self.interval_s
            self.slips += 1
        else:
            at = self.next_at
        self.next_at = at + self.interval_s
        return at


@dataclass(frozen=True, slots=True)
class Release:
    """One token of choice ``index`` (or None: the choice's end alone) and when it goes out;
    ``finish_reason`` is set on the choice's last release."""

    at: float
    index: int
    token: int | None
    finish_reason: str | None = None


@dataclass(slots=True)
class Pacer:
    """The paced releases of a request's choices, each choice on its own clock."""

    interval_s: float
    choices: int = 1
    clocks: list[PaceClock] = field(init=False)
    _heap: list[tuple[float, int, Release]] = field(init=False, default_factory=list)
    _order: itertools.count[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.clocks = [PaceClock(self.interval_s) for _ in range(self.choices)]

    def push(self, index: int, tokens: list[int], finish_reason: str | None, available_at: float) -> None:
        """Schedule an update of choice ``index``: its tokens, then its end if it finished."""
        clock = self.clocks[index]
        items: list[int | None] = list(tokens)
        if finish_reason is not None and not items:
            items.append(None)
        for i, token in enumerate(items):
            last = i == len(items) - 1
            release = Release(clock.slot(available_at), index, token, finish_reason if last else None)
            heapq.heappush(self._heap, (release.at, next(self._order), release))

    @property
    def next_at(self) -> float | None:
        """When the earliest scheduled release goes out; None when nothing is scheduled."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Release]:
        """The releases whose time has come, in schedule order; they leave the pacer."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    @property
    def slips(self) -> int:
        return sum(c.slips for c in self.clocks)
