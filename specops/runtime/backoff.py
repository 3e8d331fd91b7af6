"""When the watcher restarts a dead process: at once after a long run, then with a delay
that doubles up to a cap while it keeps dying soon after each start (a crash loop must
not spin a core nor flood its log), and again at once once it has run long enough."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    base_s: float = 1.0
    """Delay after the first quick death."""
    cap_s: float = 30.0
    """The longest delay."""
    stable_s: float = 60.0
    """A process that ran this long before it died counts as healthy: restarted at once."""

    def delay(self, quick_deaths: int) -> float:
        """Seconds to wait before the next start after `quick_deaths` in a row."""
        if quick_deaths <= 0:
            return 0.0
        return min(self.cap_s, self.base_s * 2 ** (quick_deaths - 1))


@dataclass(slots=True)
class Backoff:
    """Per component (`nats`, `postgres`, `predictor[0]`), its deaths in a row and its next
    allowed start."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _quick: dict[str, int] = field(default_factory=dict)
    _not_before: dict[str, float] = field(default_factory=dict)

    def due(self, component: str, *, uptime_s: float, now: float) -> bool:
        """Whether a dead `component` that ran `uptime_s` may be started now; the first call
        after a death schedules its start."""
        if component not in self._not_before:
            quick = self._quick.get(component, 0) + 1 if uptime_s < self.policy.stable_s else 0
            self._quick[component] = quick
            self._not_before[component] = now + self.policy.delay(quick)
        return now >= self._not_before[component]

    def started(self, component: str) -> None:
        """It was started; its next death is scheduled afresh."""
        self._not_before.pop(component, None)

    def failed(self, component: str, *, now: float) -> float:
        """Starting it failed: counts as a quick death. Returns the delay until the next try."""
        quick = self._quick.get(component, 0) + 1
        self._quick[component] = quick
        delay = self.policy.delay(quick)
        self._not_before[component] = now + delay
        return delay
