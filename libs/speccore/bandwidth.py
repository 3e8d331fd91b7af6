"""The plain-decoding limit: every new token must stream all weights from memory once."""

from __future__ import annotations

import time

import torch

from speccore import hugepages


def measure_read_bandwidth(n_bytes: int = 1 << 29, reps: int = 5) -> float:
    """Sustained read bandwidth in bytes/s (median of reps of summing a large float32 buffer,
    on huge pages where the host offers them, as the packed weights are)."""
    buf = hugepages.empty(n_bytes // 4, torch.float32).fill_(1.0)
    buf.sum()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    times.sort()
    return n_bytes / times[len(times) // 2]


def decode_limit_tokens_per_s(weight_bytes: int, bandwidth: float) -> float:
    return bandwidth / weight_bytes
