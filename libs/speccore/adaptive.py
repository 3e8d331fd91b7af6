"""Adaptive k: how many draft nodes each step verifies, chosen from the batch and the
acceptance measured so far (issue 19, ``ENABLE_L4_ADAPTIVE_K``).

Speculation pays when the target scores a block of 1 + m tokens per row for little more
than one: true at batch 1 on this CPU (cpu_kernels: a block of 4-12 rows costs about one
row), not at batch 32, where the step is already wide and every draft node is paid for. So
each step picks the cap m in 0..k_max that maximises the expected goodput::

    rows * E[tokens | m] / (verify_cost(rows * (1 + m)) + draft_cost(m))
    E[tokens | m] = 1 + sum_{i<m} prod_{j<=i} p_j

m = 0 drafts nothing: the step is plain decoding, so a batch that speculation would slow
runs as plain decoding does (within the model's error and the exploration below).

Three online estimates, all from the steps actually run (no offline calibration, so it
follows the host's load and the draft's drift):

- ``StepCost``: the verify step's seconds as a function of the block tokens it computes
  (rows x block width), an EWMA per power-of-two bucket of block tokens; between measured
  buckets linear, outside them a prior shape (1 + n / 8, the CPU kernels' knee) anchored
  at the nearest measurement, and never decreasing in n (noise must not make wider
  blocks look cheaper).
- ``DraftCost``: the draft's seconds per step, in two parts: reading the step's outcome
  (an EWMA over every step: a head reads the accepted tokens whatever the cap) and
  proposing (an EWMA per m; an unmeasured m scales the nearest measured one linearly,
  and a smaller m never costs more than a larger one). Keyed by m only, not by batch:
  the EWMAs follow the batch as it changes.
- ``Acceptance``: p_i = P(accept position i | positions < i accepted), an EWMA per position
  over the rows that drafted that deep. A row that drafted nothing under a positive cap
  (n-gram without a match) counts as a rejection at position 0: it yields one token, as
  the estimate then says. For trees the position is the accepted depth.

Exploration: positions at or beyond the chosen m get no new evidence, so a draft that
recovers would never be picked again. Every so many steps the cap is k_max instead, the
interval set so that exploring costs about ``explore_budget`` (1%) of the time at the
predicted costs. Losslessness is untouched: a smaller cap only drafts less, and the
verifier rules on whatever is drafted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PRIOR_KNEE = 8.0  # block tokens at which the prior cost doubles (cpu_kernels: ~4-12 rows cost one)
PRIOR_ACCEPT = 0.5  # p_i before any evidence


def bucket(tokens: int) -> int:
    """The power-of-two bucket of a block of ``tokens`` tokens (1 -> 0, 2 -> 1, 3-4 -> 2, ...)."""
    return max(tokens - 1, 0).bit_length()


def prior(tokens: float) -> float:
    return 1.0 + tokens / PRIOR_KNEE


@dataclass(slots=True)
class _Point:
    tokens: float  # EWMA of the block tokens measured in this bucket
    seconds: float  # EWMA of their step seconds


@dataclass(slots=True)
class StepCost:
    """Verify seconds by block tokens, learnt from the steps run."""

    alpha: float = 0.2
    points: dict[int, _Point] = field(default_factory=dict)

    def observe(self, tokens: int, seconds: float) -> None:
        key = bucket(tokens)
        point = self.points.get(key)
        if point is None:
            self.points[key] = _Point(float(tokens), seconds)
            return
        point.tokens += self.alpha * (tokens - point.tokens)
        point.seconds += self.alpha * (seconds - point.seconds)

    def __call__(self, tokens: float) -> float:
        """Predicted seconds of a verify step over ``tokens`` block tokens."""
        pts = sorted(((p.tokens, p.seconds) for p in self.points.values()), key=lambda p: p[0])
        if not pts:
            return prior(tokens)
        # Never cheaper for more tokens: a running maximum over the measured points.
        mono: list[tuple[float, float]] = []
        for n, s in pts:
            mono.append((n, max(s, mono[-1][1]) if mono else s))
        if tokens <= mono[0][0]:
            n0, s0 = mono[0]
            return s0 * prior(tokens) / prior(n0)
        if tokens >= mono[-1][0]:
            n1, s1 = mono[-1]
            return s1 * prior(tokens) / prior(n1)
        for (n0, s0), (n1, s1) in zip(mono, mono[1:], strict=False):
            if n0 <= tokens <= n1:
                return s0 + (s1 - s0) * (tokens - n0) / (n1 - n0) if n1 > n0 else s1
        raise AssertionError("unreachable: tokens lies between the measured points")


@dataclass(slots=True)
class DraftCost:
    """The proposer's seconds per step: reading the step's outcome, which every step pays
    whatever its cap (a head still reads the accepted tokens), plus proposing, by cap.

    Reading is one estimate refreshed by every step, so a slow step (a first call's kernel
    set-up, say) fades whatever cap it ran under; proposing never costs more for a smaller
    cap than a larger one measured (a stale slow value at cap 0 must not make drafting look
    free)."""

    alpha: float = 0.2
    reading: float | None = None
    proposing: dict[int, float] = field(default_factory=dict)

    def observe(self, cap: int, *, propose_s: float, observe_s: float) -> None:
        old = self.reading
        self.reading = observe_s if old is None else old + self.alpha * (observe_s - old)
        old = self.proposing.get(cap)
        self.proposing[cap] = propose_s if old is None else old + self.alpha * (propose_s - old)

    def __call__(self, cap: int) -> float:
        return (self.reading or 0.0) + self._propose(cap)

    def _propose(self, cap: int) -> float:
        known = [m for m in self.proposing if m > 0]
        if cap in self.proposing:
            seconds = self.proposing[cap]
        elif cap == 0 or not known:
            seconds = 0.0
        else:
            near = min(known, key=lambda m: abs(m - cap))
            seconds = self.proposing[near] * cap / near
        larger = [self.proposing[m] for m in known if m > cap]
        return min([seconds, *larger])


@dataclass(slots=True)
class Acceptance:
    """p_i, the chance position i is accepted once positions < i were, per position."""

    alpha: float = 0.05  # per row observation
    p: list[float] = field(default_factory=list)

    def observe(self, rows: list[tuple[int, int]]) -> None:
        """One step's rows as (draft depth, accepted length); rows that could not draft
        (cap 0) are left out by the caller."""
        hits: dict[int, list[int]] = {}
        for depth, accepted in rows:
            for i in range(min(accepted + 1, max(depth, 1))):
                hits.setdefault(i, []).append(int(i < accepted))
        for i, outcomes in sorted(hits.items()):
            while len(self.p) <= i:
                self.p.append(PRIOR_ACCEPT)
            rate = sum(outcomes) / len(outcomes)
            weight = 1.0 - (1.0 - self.alpha) ** len(outcomes)
            self.p[i] += weight * (rate - self.p[i])

    def expected_tokens(self, cap: int) -> float:
        """E[tokens | cap]: the bonus token plus each position's chance to be reached and accepted."""
        total, reach = 1.0, 1.0
        for i in range(cap):
            reach *= self.p[i] if i < len(self.p) else PRIOR_ACCEPT
            total += reach
        return total


@dataclass(slots=True)
class AdaptiveK:
    """Chooses each step's draft cap and learns from the step's outcome. One per engine."""

    k_max: int
    explore_budget: float = 0.01  # share of the time spent trying k_max to refresh its estimates
    cost: StepCost = field(default_factory=StepCost)
    draft: DraftCost = field(default_factory=DraftCost)
    acceptance: Acceptance = field(default_factory=Acceptance)
    steps: int = 0
    last_full: int = 0  # the step that last drafted at k_max

    def __post_init__(self) -> None:
        if self.k_max <= 0:
            raise ValueError(f"adaptive k needs k_max >= 1, got {self.k_max}")

    def step_seconds(self, rows: int, cap: int) -> float:
        return self.cost(rows * (1 + cap)) + self.draft(cap)

    def goodput(self, rows: int, active: int, cap: int) -> float:
        """Expected tokens per second of a step of ``rows`` rows (``active`` still decoding)."""
        return active * self.acceptance.expected_tokens(cap) / self.step_seconds(rows, cap)

    def best(self, rows: int, active: int) -> int:
        """The cap of the highest expected goodput (the smallest on a tie)."""
        return max(range(self.k_max + 1), key=lambda m: (self.goodput(rows, active, m), -m))

    def choose(self, rows: int, active: int) -> int:
        """This step's cap: the best, or k_max when it is time to explore."""
        self.steps += 1
        m = self.best(rows, active)
        if m < self.k_max:
            extra = self.step_seconds(rows, self.k_max) / self.step_seconds(rows, m) - 1.0
            interval = max(8, math.ceil(extra / self.explore_budget))
            if self.steps - self.last_full >= interval:
                m = self.k_max
        if m == self.k_max:
            self.last_full = self.steps
        return m

    def record(
        self,
        *,
        rows: int,
        width: int,
        cap: int,
        propose_s: float,
        verify_s: float,
        observe_s: float,
        outcomes: list[tuple[int, int]],
    ) -> None:
        """A step run: ``rows`` rows of ``width`` draft nodes under ``cap``, the seconds of its
        three phases, and each active row's (draft depth, accepted length)."""
        self.cost.observe(rows * (1 + width), verify_s)
        self.draft.observe(cap, propose_s=propose_s, observe_s=observe_s)
        if cap > 0:
            self.acceptance.observe(outcomes)
