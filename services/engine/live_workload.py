"""Each tenant's live workload on an engine server: a rolling window of its requests' fingerprint
probabilities, and when to publish its summary (issue 44, ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT).

Pure, no I/O: live_workload_events.py classifies the prompts (speccatalog.fingerprint) off the
request path, feeds :meth:`LiveWorkloads.observe` and publishes what it returns.

Glossary:

- *window*: a tenant's last ``window`` requests (N), each kept as its probability per
  fingerprint (the classifier's ``agentic`` counted as ``structured``) and its time: eight
  floats, no text. Memory is bounded by N per tenant and ``max_tenants`` tenants (the least
  recently seen is forgotten first: a claim's name is the client's to choose).
- *summary*: the window's probabilities summed per fingerprint, its request count and time
  span. Divided by the count, they are the pooled probabilities the gateway takes the
  fingerprint from, as it does for a request's own samples.
- *every*: a tenant's summary is due at its K-th, 2K-th, ... request.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from speccatalog.workloads import FINGERPRINTS, fingerprint_of


@dataclass(frozen=True, slots=True)
class SummaryPolicy:
    window: int = 256  # N: a tenant's requests in its window
    every: int = 16  # K: a summary every K requests of a tenant
    max_tenants: int = 1024

    def __post_init__(self) -> None:
        if min(self.window, self.every, self.max_tenants) < 1:
            raise ValueError("the window, the summary interval and the tenants kept must be at least 1")


@dataclass(frozen=True, slots=True)
class Summary:
    tenant: str
    requests: int  # in the window
    span_s: float  # from the window's first request to its last
    probability_sums: dict[str, float]  # fingerprint -> summed probability
    observed: int  # requests of the tenant observed so far


def by_fingerprint(probabilities: Mapping[str, float]) -> tuple[float, ...]:
    """A request's class probabilities as one probability per fingerprint, in FINGERPRINTS order."""
    folded = dict.fromkeys(FINGERPRINTS, 0.0)
    for name, p in probabilities.items():
        folded[fingerprint_of(name)] += p
    return tuple(folded.values())


@dataclass(slots=True)
class _Window:
    items: deque[tuple[float, tuple[float, ...]]]  # (time, probability per fingerprint)
    observed: int = 0


@dataclass(slots=True)
class LiveWorkloads:
    policy: SummaryPolicy = field(default_factory=SummaryPolicy)
    tenants: OrderedDict[str, _Window] = field(default_factory=OrderedDict)

    def observe(self, tenant: str, probabilities: Mapping[str, float], now: float) -> Summary | None:
        """One request of ``tenant`` classified at ``now`` (seconds); its summary when one is due."""
        window = self.tenants.get(tenant)
        if window is None:
            window = _Window(deque(maxlen=self.policy.window))
            self.tenants[tenant] = window
            if len(self.tenants) > self.policy.max_tenants:
                self.tenants.popitem(last=False)
        self.tenants.move_to_end(tenant)
        window.items.append((now, by_fingerprint(probabilities)))
        window.observed += 1
        return self.summary(tenant) if window.observed % self.policy.every == 0 else None

    def summary(self, tenant: str) -> Summary | None:
        """The tenant's window summed; None for a tenant not (or no longer) kept."""
        window = self.tenants.get(tenant)
        if window is None or not window.items:
            return None
        sums = [sum(column) for column in zip(*(p for _, p in window.items), strict=True)]
        return Summary(
            tenant=tenant,
            requests=len(window.items),
            span_s=window.items[-1][0] - window.items[0][0],
            probability_sums=dict(zip(FINGERPRINTS, sums, strict=True)),
            observed=window.observed,
        )
