"""`specops report`: the serving report — load at fixed concurrency through `specops serve engine`,
tail latency, throughput, goodput, acceptance per prompt distribution and $/1M output tokens.

Modules: `loadgen` (the closed-loop load generator), `metrics` (the server's Prometheus deltas),
`stats` (pure summaries), `prices` (the price table with sources), `render` (markdown and plots).
"""
