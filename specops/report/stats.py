"""Pure summaries of a load level: throughput, percentiles, goodput under an SLO, ratios."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specops.report.loadgen import LevelRun


@dataclass(frozen=True, slots=True)
class Slo:
    """A request is "good" when its queue-inclusive TTFT and its TPOT are both within bounds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(run: LevelRun, slo: Slo) -> dict[str, Any]:
    """Throughput (output tokens/s over the level's wall time), p50/p99 of TTFT, TPOT and e2e in
    ms, goodput (good requests/s) and the errors."""
    ok = [r for r in run.records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    ttft = [r.ttft_s for r in ok]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in ok]
    good = [r for r in ok if r.ttft_s <= slo.ttft_s and (r.tpot_s is None or r.tpot_s <= slo.tpot_s)]
    out: dict[str, Any] = {
        "concurrency": run.concurrency,
        "requests": len(run.records),
        "errors": [r.error for r in run.records if r.error is not None],
        "wall_s": run.wall_s,
        "output_tokens": tokens,
        "throughput_tok_s": tokens / run.wall_s if run.wall_s > 0 else 0.0,
        "requests_s": len(ok) / run.wall_s if run.wall_s > 0 else 0.0,
        "goodput_req_s": len(good) / run.wall_s if run.wall_s > 0 else 0.0,
        "slo_attainment": len(good) / len(run.records) if run.records else 0.0,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for q in (50, 99):
            p = percentile(values, q)
            out[f"p{q}_{name}_ms"] = None if p is None else p * 1000
    return out


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def cost_per_million(price_per_hour: float, tokens_per_s: float) -> float | None:
    """$ per 1M output tokens of a machine billed `price_per_hour` at a sustained throughput."""
    if tokens_per_s <= 0:
        return None
    return price_per_hour / 3600 / tokens_per_s * 1e6


def break_even_tok_s(price_per_hour: float, api_per_million: float) -> float:
    """Output tokens/s a machine must sustain to cost the same per token as an API price."""
    return price_per_hour / 3600 / api_per_million * 1e6
