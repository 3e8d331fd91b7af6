"""Prefix KV cache: the keys and values of earlier prompts, reused by later prompts that
start alike.

Agents send the same system prompt, tool schema and session history with every call, and a
retried task sends the same task again. vLLM (automatic prefix caching) and SGLang (radix
cache) skip prefilling a prefix they already hold, and so does speccore's engine with a
prefix cache (``Engine(prefix_cache=...)``): each scope keeps the prefilled prompts of its
latest requests, and a new prompt takes the keys and values (and the proposer's features,
for families that read hidden states) of the longest prefix it shares with one of them,
then prefills only the rest.

Lossless: a token's key and value depend only on the tokens up to it. On the row-invariant
CPU kernels (``speccore.cpu_kernels``) the rest, prefilled after reused keys, gets the very
bits a prefill of the whole prompt gives; on CUDA it is equal within rounding, as any block
is.

Like the draft pools it is a cache shared across requests, so it is a side channel (F-S1):
a prompt whose prefix someone sent before prefills faster. A request reads and feeds only
its scope's entries (``Request.draft_scope``: one scope in the single-tenant tier, one per
tenant where the tenant's policy keeps caches per tenant), and each scope has its own
budget, so one tenant's traffic never evicts another's entries.

Bounded: each scope keeps at most ``max_bytes`` of entries, the least recently used dropped
first, and at most ``max_scopes`` scopes are kept, the least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from speccore.errors import SpecError

PREFIX_MIN_TOKENS = 16  # a shorter shared prefix is not worth a lookup and a copy
PREFIX_MAX_BYTES = 512 * 2**20  # per scope
PREFIX_MAX_SCOPES = 16


@dataclass(frozen=True, slots=True)
class Prefix:
    """A prefilled prompt: its tokens, each layer's keys and values of them
    ([kv_heads, len(tokens), head_dim]) and the proposer's features ([len(tokens), F]) or None."""

    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    features: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, *([self.features] if self.features is not None else [])]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True, slots=True)
class Reuse:
    """What a prompt takes from the cache: the first ``length`` tokens of ``prefix``."""

    prefix: Prefix
    length: int


@dataclass(slots=True)
class PrefixStats:
    lookups: int = 0  # prompts that asked
    hits: int = 0  # prompts that reused a prefix
    reused_tokens: int = 0  # prompt tokens not prefilled thanks to the cache
    prompt_tokens: int = 0  # prompt tokens of every lookup (prefilled or reused)


def shared_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if b[:n] == a[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b[lo:mid] == a[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class PrefixCache:
    """Every scope's prefilled prompts; what one engine reads before a prefill and feeds
    after it. The entries hold the engine's own features, so an engine's cache is its own.
    One thread (the engine's) uses it."""

    max_bytes: int = PREFIX_MAX_BYTES
    max_scopes: int = PREFIX_MAX_SCOPES
    min_tokens: int = PREFIX_MIN_TOKENS
    scopes: OrderedDict[str, OrderedDict[tuple[int, ...], Prefix]] = field(default_factory=OrderedDict)
    stats: PrefixStats = field(default_factory=PrefixStats)
    held_bytes: int = 0  # of every scope's entries (kept up to date: /metrics reads it from another thread)

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_scopes <= 0 or self.min_tokens <= 0:
            raise SpecError("a prefix cache needs a positive byte budget, scope count and minimum length")

    def lookup(self, scope: str, tokens: list[int]) -> Reuse | None:
        """The longest prefix of ``tokens`` (at least ``min_tokens``) a prompt of the scope
        held, or None."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(tokens)
        entries = self.scopes.get(scope)
        if not entries:
            return None
        self.scopes.move_to_end(scope)
        best: Reuse | None = None
        wanted = tuple(tokens)
        for prefix in entries.values():
            length = shared_length(prefix.tokens, wanted)
            if length >= self.min_tokens and (best is None or length > best.length):
                best = Reuse(prefix, length)
        if best is not None:
            entries.move_to_end(best.prefix.tokens)
            self.stats.hits += 1
            self.stats.reused_tokens += best.length
        return best

    def add(self, scope: str, prefix: Prefix) -> None:
        """Keep a prefilled prompt; entries it extends are dropped, then the least recently
        used until the scope fits its budget (a prompt over the budget is not kept)."""
        if len(prefix.tokens) < self.min_tokens or prefix.nbytes > self.max_bytes:
            return
        entries = self.scopes.setdefault(scope, OrderedDict())
        self.scopes.move_to_end(scope)
        for held in [t for t in entries if shared_length(t, prefix.tokens) == len(t)]:
            self.held_bytes -= entries.pop(held).nbytes
        entries[prefix.tokens] = prefix
        self.held_bytes += prefix.nbytes
        scope_bytes = sum(p.nbytes for p in entries.values())
        while scope_bytes > self.max_bytes:
            _, dropped = entries.popitem(last=False)
            scope_bytes -= dropped.nbytes
            self.held_bytes -= dropped.nbytes
        while len(self.scopes) > self.max_scopes:
            _, gone = self.scopes.popitem(last=False)
            self.held_bytes -= sum(p.nbytes for p in gone.values())
