"""Drift of the primary method's acceptance, per (tenant, workload), and the fallback it switches to.

Pure decisions, no I/O: the worker asks :meth:`DriftMonitor.route` which method decodes a
request of a key and tells :meth:`DriftMonitor.observe` what the request measured when it
finishes; ``observe`` returns a :class:`Transition` when the key switches (the I/O side logs,
counts and publishes it, drift_events.py).

Per key, acceptance is token-weighted: accepted draft tokens / draft tokens verified, summed
over requests, so a long request weighs by its tokens and a request that drafted nothing
weighs nothing.

- **Baseline**: the primary's acceptance over the key's first ``baseline_requests`` requests
  (or ``DriftPolicy.baseline`` when given, e.g. a run's measured acceptance).
- **Detection**: once the baseline is set, the rolling acceptance of the key's last ``window``
  primary requests; below ``threshold`` x baseline, the key drifts: its new requests go to the
  fallback. Traffic whose acceptance is below that bound is detected by the ``window``-th
  request of it at the latest (the window then holds only such requests); sooner when the drop
  is larger.
- **Probing and recovery** (hysteresis): on the fallback, every ``probe_every``-th request of
  the key still goes to the primary; the window restarts at the switch and holds those probes
  alone. When it is full again and at or above ``recover`` x baseline (``recover`` >
  ``threshold``), the key switches back.
- **Fallback** ``ngram``, ``none`` (plain decoding), or ``auto``: n-gram while its own rolling
  mean acceptance length (tokens per verify step, the bonus token included) on the key's
  fallback traffic is at least ``auto_min_mal``, plain decoding below it. A verify step of
  k + 1 tokens costs more than a plain step, so an n-gram that accepts nearly nothing is
  slower than plain; ``auto_min_mal`` is that break-even (measured in bench/drift.py). While
  on plain, half of the probes go to n-gram instead of the primary, so auto comes back to
  n-gram when its acceptance does.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from specplatform.tenant_signature import TENANT_HEADER, UNCLAIMED_TENANT, WORKLOAD_HEADER

FALLBACKS = ("ngram", "none", "auto")
# The name of a request's tenant when it names none (reserved: no tenant has it), and of its
# workload when it names none.
DEFAULT_KEY_PART = UNCLAIMED_TENANT
# A request names its key in headers, TENANT_HEADER and WORKLOAD_HEADER (the OpenAI `user`
# field is an end user, too many values for a metric label); without them it is the `default`
# tenant's `default` workload. There is no workload classifier in the project to guess it from
# the prompt.
_KEY_PART = re.compile(r"[A-Za-z0-9_-]{1,64}")
TransitionKind = Literal["detected", "recovered"]


@dataclass(frozen=True, slots=True)
class DriftKey:
    tenant: str = DEFAULT_KEY_PART
    workload: str = DEFAULT_KEY_PART


def key_of(tenant: str | None, workload: str | None) -> DriftKey:
    """The key of a request's headers; ValueError for a value that is no subject token."""
    parts = []
    for header, value in ((TENANT_HEADER, tenant), (WORKLOAD_HEADER, workload)):
        if value is None or value == "":
            parts.append(DEFAULT_KEY_PART)
        elif _KEY_PART.fullmatch(value):
            parts.append(value)
        else:
            raise ValueError(f"{header} must match {_KEY_PART.pattern}, got {value!r}")
    return DriftKey(*parts)


DEFAULT_KEY = DriftKey()


@dataclass(frozen=True, slots=True)
class DriftPolicy:
    primary: str
    fallback: str = "ngram"  # ngram | none | auto
    window: int = 8  # N: primary requests in the rolling window
    baseline_requests: int = 8  # W: first primary requests of a key that set its baseline
    threshold: float = 0.6  # drift below threshold x baseline
    recover: float = 0.8  # back to the primary at or above recover x baseline
    probe_every: int = 4  # M: on the fallback, every M-th request of the key goes to the primary
    baseline: float | None = None  # a configured baseline for every key (else measured per key)
    auto_min_mal: float = 1.3  # auto: n-gram's mean acceptance length below this -> plain

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if self.primary in ("none", "ngram"):
            raise ValueError(f"the primary {self.primary!r} has no draft to drift; serve a head or draft")
        if min(self.window, self.baseline_requests, self.probe_every) < 1:
            raise ValueError("window, baseline requests and probe interval must be at least 1")
        if not 0.0 < self.threshold < self.recover:
            raise ValueError(f"need 0 < threshold < recover, got {self.threshold} and {self.recover}")
        if self.baseline is not None and not 0.0 < self.baseline <= 1.0:
            raise ValueError(f"a baseline acceptance is in (0, 1], got {self.baseline}")

    @property
    def methods(self) -> tuple[str, ...]:
        """The engines a server with this policy needs, the primary first."""
        fallbacks = {"ngram": ("ngram",), "none": ("none",), "auto": ("ngram", "none")}[self.fallback]
        return (self.primary, *fallbacks)


@dataclass(frozen=True, slots=True)
class Measured:
    """What one finished request measured: draft tokens verified, accepted, verify steps."""

    drafted: int
    accepted: int
    drafts: int  # verify steps that drafted at least one token


@dataclass(frozen=True, slots=True)
class Transition:
    """A key switched: to its fallback (``detected``) or back to the primary (``recovered``)."""

    kind: TransitionKind
    key: DriftKey
    baseline: float
    current: float  # the rolling acceptance that decided it
    window: int  # requests in that window
    method: str  # what the key's new requests now go to
    requests: int  # requests of the key observed so far


class _Rolling:
    """Token-weighted acceptance of the last ``size`` requests."""

    def __init__(self, size: int) -> None:
        self.items: deque[Measured] = deque(maxlen=size)

    def add(self, m: Measured) -> None:
        self.items.append(m)

    @property
    def full(self) -> bool:
        return len(self.items) == self.items.maxlen

    @property
    def acceptance(self) -> float:
        drafted = sum(m.drafted for m in self.items)
        return sum(m.accepted for m in self.items) / drafted if drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        drafts = sum(m.drafts for m in self.items)
        return 1.0 + sum(m.accepted for m in self.items) / drafts if drafts else 1.0

    def clear(self) -> None:
        self.items.clear()


@dataclass(slots=True)
class KeyState:
    baseline: float | None
    primary: _Rolling
    ngram: _Rolling  # n-gram's own acceptance on the key's fallback traffic (auto)
    baseline_drafted: int = 0
    baseline_accepted: int = 0
    baseline_seen: int = 0
    fallback: str | None = None  # the method new requests go to while drifted; None: the primary
    routed: int = 0  # requests routed since the last switch
    probes: int = 0
    observed: int = 0

    @property
    def drifted(self) -> bool:
        return self.fallback is not None


@dataclass(slots=True)
class DriftMonitor:
    policy: DriftPolicy
    keys: dict[DriftKey, KeyState] = field(default_factory=dict)

    def state(self, key: DriftKey) -> KeyState:
        found = self.keys.get(key)
        if found is None:
            p = self.policy
            found = KeyState(p.baseline, _Rolling(p.window), _Rolling(p.window))
            self.keys[key] = found
        return found

    def active(self, key: DriftKey) -> str:
        """The method the key's requests go to (probes aside)."""
        return self.state(key).fallback or self.policy.primary

    def route(self, key: DriftKey) -> str:
        """The method that decodes the key's next request."""
        s = self.state(key)
        s.routed += 1
        if s.fallback is None or s.routed % self.policy.probe_every:
            return self.active(key)
        s.probes += 1
        if self.policy.fallback == "auto" and s.fallback == "none" and s.probes % 2 == 0:
            return "ngram"
        return self.policy.primary

    def observe(self, key: DriftKey, method: str, m: Measured) -> Transition | None:
        """A request of the key decoded by ``method`` finished; the switch it causes, if any."""
        s = self.state(key)
        s.observed += 1
        p = self.policy
        if method == "ngram":
            s.ngram.add(m)
            self._auto(s)
            return None
        if method != p.primary:
            return None
        if s.baseline is None:
            s.baseline_seen += 1
            s.baseline_drafted += m.drafted
            s.baseline_accepted += m.accepted
            if s.baseline_seen >= p.baseline_requests and s.baseline_drafted:
                s.baseline = s.baseline_accepted / s.baseline_drafted
            return None
        s.primary.add(m)
        if not s.primary.full:
            return None
        current = s.primary.acceptance
        if s.fallback is None and current < p.threshold * s.baseline:
            return self._switch(key, s, "detected", current)
        if s.fallback is not None and current >= p.recover * s.baseline:
            return self._switch(key, s, "recovered", current)
        return None

    def _switch(self, key: DriftKey, s: KeyState, kind: TransitionKind, current: float) -> Transition:
        p = self.policy
        s.fallback = ("ngram" if p.fallback == "auto" else p.fallback) if kind == "detected" else None
        s.primary.clear()  # the probes alone decide the recovery; after it, the window starts anew
        s.ngram.clear()
        s.routed = s.probes = 0
        assert s.baseline is not None
        return Transition(kind, key, s.baseline, current, p.window, self.active(key), s.observed)

    def _auto(self, s: KeyState) -> None:
        """auto: plain decoding while n-gram's own acceptance on the key is below break-even."""
        if self.policy.fallback == "auto" and s.fallback is not None and s.ngram.full:
            s.fallback = "ngram" if s.ngram.mean_acceptance_length >= self.policy.auto_min_mal else "none"
