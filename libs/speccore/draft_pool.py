"""Cross-request draft pools: what earlier requests wrote, for a proposer to draft from when
the row's own context matches less (the global tree of SuffixDecoding, arXiv 2411.04975:
agentic and repetitive traffic repeats earlier requests' text, which the row itself has not
seen). The n-gram proposer's pool (:class:`DraftPool`, this module) maps n-grams to what
followed them; the suffix proposer's (``speccore.suffix_tree.OutputTree``) counts every
pattern of earlier outputs. :class:`DraftPools` keeps one pool per scope, of the kind the
engine's proposer makes.

Lossless like every draft: the pool only proposes, the verifier decides. It is also a cache
shared across requests, so it is a side channel (F-S1, issue 20): a request whose text an
earlier request wrote drafts well from the pool and finishes in fewer steps, so its timing
tells whether someone asked it before. A request names its *scope* (``Request.draft_scope``)
and reads and feeds only that scope's pool: one scope for the whole deployment in the
single-tenant tier, a scope per tenant where the tenant's policy keeps caches per tenant.

Each pool is bounded (the n-gram pool: at most ``max_entries`` n-grams, the least recently
written dropped first; an n-gram maps to the ``span`` tokens that followed its latest
occurrence). So is the number of pools: at most ``max_scopes``, the least recently used
scope's pool dropped first (a request naming a new scope costs at most one pool's memory,
whoever names it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from speccore.errors import SpecError

POOL_NGRAM_MIN = 2  # a single shared token says little across requests
POOL_NGRAM_MAX = 8
POOL_SPAN = 16  # tokens kept after each n-gram (a draft is at most this long)
POOL_MAX_ENTRIES = 200_000  # per scope
POOL_MAX_SCOPES = 64  # pools kept at once


@dataclass(frozen=True, slots=True)
class PoolMatch:
    """A draft from the pool: the matched suffix's length and the tokens that followed it."""

    length: int
    tokens: list[int]


class DraftPool:
    """One scope's n-grams -> what followed their latest occurrence in a finished request."""

    def __init__(
        self,
        ngram_min: int = POOL_NGRAM_MIN,
        ngram_max: int = POOL_NGRAM_MAX,
        span: int = POOL_SPAN,
        max_entries: int = POOL_MAX_ENTRIES,
    ) -> None:
        if not 1 <= ngram_min <= ngram_max or span <= 0 or max_entries <= 0:
            raise ValueError("a draft pool needs 1 <= ngram_min <= ngram_max, a positive span and size")
        self.sizes = range(ngram_min, ngram_max + 1)
        self.span = span
        self.max_entries = max_entries
        self.after: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self.sequences = 0  # finished requests added

    def add(self, prompt: list[int], output: list[int]) -> None:
        """Index a finished request's prompt and output."""
        tokens = prompt + output
        for end in range(len(tokens) - 1):  # n-grams ending at `end`, followed by tokens[end + 1:]
            following = tuple(tokens[end + 1 : end + 1 + self.span])
            for n in self.sizes:
                if end + 1 < n:
                    break
                key = tuple(tokens[end + 1 - n : end + 1])
                self.after[key] = following
                self.after.move_to_end(key)
        while len(self.after) > self.max_entries:
            self.after.popitem(last=False)
        self.sequences += 1

    def lookup(self, tokens: list[int], k: int) -> PoolMatch | None:
        """Up to k tokens after the longest suffix of ``tokens`` the pool holds; None if none."""
        for n in reversed(self.sizes):
            if n > len(tokens):
                continue
            following = self.after.get(tuple(tokens[len(tokens) - n :]))
            if following:
                return PoolMatch(n, list(following[:k]))
        return None

    def __len__(self) -> int:
        return len(self.after)


@dataclass(slots=True)
class PoolStats:
    """Draft steps' counters: a scope's, or every scope's (the server's metrics)."""

    lookups: int = 0  # draft steps that asked the pool
    hits: int = 0  # of them, those it drafted for
    draft_tokens: int = 0  # tokens it drafted


class ScopePool(Protocol):
    """One scope's pool, whatever the family: fed each finished request of the scope."""

    @property
    def sequences(self) -> int: ...  # finished requests it was fed (and keeps, where it drops any)

    def add(self, prompt: list[int], output: list[int]) -> None: ...

    def __len__(self) -> int: ...  # entries it holds (n-grams, tree nodes)


P = TypeVar("P", bound=ScopePool)


@dataclass(slots=True)
class DraftPools(Generic[P]):
    """Every scope's pool, made on first use (the least recently used dropped past
    ``max_scopes``); what an engine's proposer reads and its finished rows feed
    (``Engine(draft_pools=...)``). The engine binds the pools to its proposer's kind
    (``Proposer.new_draft_pool``) unless they are made with one. One thread (the batcher's)
    uses it."""

    make: Callable[[], P] | None = None
    max_scopes: int = POOL_MAX_SCOPES
    pools: OrderedDict[str, P] = field(default_factory=OrderedDict)
    stats: dict[str, PoolStats] = field(default_factory=dict)
    totals: PoolStats = field(default_factory=PoolStats)  # every scope's, dropped ones too
    kind: str | None = None  # who makes the pools (the proposer's family), once bound

    def bind(self, kind: str, make: Callable[[], P]) -> None:
        """Make the pools with ``make`` from now on; SpecError if another kind makes them."""
        if self.kind is not None and self.kind != kind:
            raise SpecError(f"these draft pools hold {self.kind} pools, not {kind} ones")
        if self.kind is None:
            self.kind, self.make = kind, make

    def pool(self, scope: str) -> P:
        if scope in self.pools:
            self.pools.move_to_end(scope)
            return self.pools[scope]
        if self.make is None:
            raise SpecError("these draft pools are bound to no proposer yet")
        self.pools[scope] = self.make()
        self.stats[scope] = PoolStats()
        while len(self.pools) > self.max_scopes:
            dropped, _ = self.pools.popitem(last=False)
            del self.stats[dropped]
        return self.pools[scope]

    def add(self, scope: str, prompt: list[int], output: list[int]) -> None:
        self.pool(scope).add(prompt, output)

    def record(self, scope: str, drafted: int | None) -> None:
        """Count a draft step that asked the scope's pool: ``drafted`` tokens came from it
        (None: the pool had nothing to draft)."""
        for stats in (self.stats[scope], self.totals):
            stats.lookups += 1
            if drafted is not None:
                stats.hits += 1
                stats.draft_tokens += drafted
