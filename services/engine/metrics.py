"""The engine server's Prometheus metrics: vLLM's serving and spec-decode metrics under the
`specops:` prefix, each labelled `model_name`, as vLLM labels its own.

Counters (exported with `_total`): `spec_decode_num_drafts`, `spec_decode_num_draft_tokens`,
`spec_decode_num_accepted_tokens`, `spec_decode_num_accepted_tokens_per_pos{position}`,
`prompt_tokens`, `generation_tokens`, `request_success{finished_reason}`. Acceptance rate is
rate(accepted) / rate(draft_tokens); mean acceptance length 1 + accepted / drafts.

Histograms, all from the request's arrival at the HTTP handler (monotonic clock):
`request_queue_time_seconds` to its admission into the running batch,
`time_to_first_token_seconds` to its first token handed to the HTTP side,
`e2e_request_latency_seconds` to its last, and `inter_token_latency_seconds` per gap between
two deliveries. Speculative decoding delivers several tokens at once: a delivery of m tokens
g seconds after the previous one counts m observations of g / m, so the histogram stays per
token (vLLM's TPOT) whatever the acceptance. The tokens of the first delivery count in TTFT
only.

Histogram `spec_decode_adaptive_k` (speccore's own, with `--adaptive-k`): the draft nodes per
row that adaptive k allowed, one observation per batch step (0: the step decoded plainly).

Gauges `num_requests_running` / `num_requests_waiting`: the batcher's, set every step.

Security (issue 20): counters `paced_tokens` and `paced_slips` (F-S2: tokens released on a
paced clock, and releases that waited for their token past their slot: the pace is shorter
than the engine's step); with a cross-request draft pool (F-S1), summed over the scopes
(never per tenant): counters `draft_pool_lookups`, `draft_pool_hits` and
`draft_pool_draft_tokens` (steps that asked a pool, those it drafted for, the tokens it
drafted) and gauges `draft_pool_scopes`, `draft_pool_entries` and `draft_pool_requests` (the
pools kept, the n-grams or suffix-tree nodes they hold, the finished requests they keep), read from the pools
when scraped.

The registry is the server's own (not prometheus_client's global one), so that two servers
in one process, or a test, never share counts.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speccore.draft_pool import DraftPools
from speccore.prefix_cache import PrefixCache
from specops_services.engine.logic import SpecCounts

PREFIX = "specops:"
# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
ADAPTIVE_K_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0, 64.0)
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class EngineMetrics:
    def __init__(self, model_name: str, positions: int = 0) -> None:
        """``positions``: the configured draft depth k, whose per-position acceptance series
        exist from the start (0..k-1, at 0), so that a dashboard sees them before a request."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, label = self.registry, ["model_name"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*label, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, label, buckets=buckets, registry=r)

        self.drafts = counter("spec_decode_num_drafts", "Row-steps that drafted at least one token.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Row-steps whose accepted draft length exceeds the position.",
            ("position",),
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests admitted.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated and delivered.")
        self.request_success = counter(
            "request_success", "Requests finished, by reason (stop, length, abort).", ("finished_reason",)
        )
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to the first token.", TTFT_BUCKETS)
        self.itl = histogram(
            "inter_token_latency_seconds", "Time per output token after the first.", ITL_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to the last token.", REQUEST_BUCKETS)
        self.queue_time = histogram(
            "request_queue_time_seconds", "Arrival to admission into the running batch.", REQUEST_BUCKETS
        )
        self.adaptive_k = histogram(
            "spec_decode_adaptive_k", "Draft nodes per row adaptive k allowed, per step.", ADAPTIVE_K_BUCKETS
        )
        self.running = Gauge(
            PREFIX + "num_requests_running", "Requests in the running batch.", label, registry=r
        )
        self.waiting = Gauge(
            PREFIX + "num_requests_waiting", "Requests waiting for a row.", label, registry=r
        )
        self.paced_tokens = counter("paced_tokens", "Tokens released on a paced clock (F-S2).")
        self.paced_slips = counter(
            "paced_slips", "Paced releases that waited for their token past their slot."
        )
        # Every labelled series exists from the start (at 0), as vLLM's do.
        for metric in (
            self.drafts,
            self.draft_tokens,
            self.accepted,
            self.prompt_tokens,
            self.generation_tokens,
            self.paced_tokens,
            self.paced_slips,
        ):
            metric.labels(model_name)
        for m in (self.ttft, self.itl, self.e2e, self.queue_time, self.adaptive_k):
            m.labels(model_name)
        for g in (self.running, self.waiting):
            g.labels(model_name)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(model_name, reason)
        for pos in range(positions):
            self.accepted_per_pos.labels(model_name, str(pos))

    def admitted(self, prompt_tokens: int, queued_s: float) -> None:
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)
        self.queue_time.labels(self.model_name).observe(queued_s)

    def delivered(self, tokens: int, *, since_arrival_s: float, since_last_s: float | None) -> None:
        """``tokens`` handed out; ``since_last_s`` is None for a request's first delivery."""
        if tokens <= 0:
            return
        self.generation_tokens.labels(self.model_name).inc(tokens)
        if since_last_s is None:
            self.ttft.labels(self.model_name).observe(since_arrival_s)
            return
        per_token = since_last_s / tokens
        itl = self.itl.labels(self.model_name)
        for _ in range(tokens):
            itl.observe(per_token)

    def spec(self, counts: SpecCounts) -> None:
        # A counter only grows (prometheus_client refuses a negative increment).
        self.drafts.labels(self.model_name).inc(max(counts.drafts, 0))
        self.draft_tokens.labels(self.model_name).inc(max(counts.draft_tokens, 0))
        self.accepted.labels(self.model_name).inc(max(counts.accepted, 0))
        for pos, n in enumerate(counts.accepted_per_pos):
            self.accepted_per_pos.labels(self.model_name, str(pos)).inc(max(n, 0))

    def draft_cap(self, cap: int) -> None:
        """A batch step under adaptive k allowed ``cap`` draft nodes per row."""
        self.adaptive_k.labels(self.model_name).observe(cap)

    def finished(self, reason: str, since_arrival_s: float | None) -> None:
        """A request left: ``reason`` stop, length or abort; its e2e latency unless aborted."""
        self.request_success.labels(self.model_name, reason).inc()
        if since_arrival_s is not None:
            self.e2e.labels(self.model_name).observe(since_arrival_s)

    def queues(self, *, running: int, waiting: int) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)

    def paced(self, tokens: int, slips: int) -> None:
        """A paced stream ended: ``tokens`` released, ``slips`` of its releases late."""
        self.paced_tokens.labels(self.model_name).inc(tokens)
        self.paced_slips.labels(self.model_name).inc(slips)

    def watch_pools(self, pools: DraftPools) -> None:
        self.registry.register(_PoolCollector(pools, self.model_name))

    def watch_prefix_caches(self, caches: list[PrefixCache]) -> None:
        self.registry.register(_PrefixCacheCollector(caches, self.model_name))


class _PoolCollector(Collector):
    """The draft pools' counters, summed over the scopes, read when /metrics is scraped. Not
    per scope: a scope is a tenant, and /metrics would tell anyone who reads it how much each
    tenant asks (issue 20)."""

    def __init__(self, pools: DraftPools, model_name: str) -> None:
        self.pools = pools
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name"]
        totals = self.pools.totals
        for name, help_text, value in (
            ("draft_pool_lookups", "Draft steps that asked a pool.", totals.lookups),
            ("draft_pool_hits", "Draft steps a pool drafted for.", totals.hits),
            ("draft_pool_draft_tokens", "Tokens the pools drafted.", totals.draft_tokens),
        ):
            counter = CounterMetricFamily(PREFIX + name, help_text, labels=labels)
            counter.add_metric([self.model_name], value)
            yield counter
        # list(): the worker thread may add a scope while this reads (one C call under the GIL).
        pools = list(self.pools.pools.values())
        for name, help_text, value in (
            ("draft_pool_scopes", "Pools kept (one per scope).", len(pools)),
            (
                "draft_pool_entries",
                "Entries the pools hold (n-grams, suffix-tree nodes).",
                sum(len(p) for p in pools),
            ),
            (
                "draft_pool_requests",
                "Finished requests the pools kept indexed.",
                sum(p.sequences for p in pools),
            ),
        ):
            gauge = GaugeMetricFamily(PREFIX + name, help_text, labels=labels)
            gauge.add_metric([self.model_name], value)
            yield gauge


class _PrefixCacheCollector(Collector):
    """The engines' prefix caches, summed over engines and scopes (not per scope, as the
    pools), read when /metrics is scraped; in tokens, as vLLM's prefix cache counters."""

    def __init__(self, caches: list[PrefixCache], model_name: str) -> None:
        self.caches = caches
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name"]
        for name, help_text, value in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prompt_tokens"),
            ("prefix_cache_hits", "Prompt tokens the prefix cache held (not prefilled).", "reused_tokens"),
        ):
            counter = CounterMetricFamily(PREFIX + name, help_text, labels=labels)
            counter.add_metric([self.model_name], sum(getattr(c.stats, value) for c in self.caches))
            yield counter
        gauge = GaugeMetricFamily(
            PREFIX + "prefix_cache_bytes", "Bytes the prefix caches hold.", labels=labels
        )
        gauge.add_metric([self.model_name], sum(c.held_bytes for c in self.caches))
        yield gauge
