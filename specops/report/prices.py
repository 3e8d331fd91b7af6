"""Prices the report turns throughput into $/1M output tokens with, each with its source and the
date the source states. Prices move; edit this table (and its dates) rather than the report.

Only prices read in a cited page are listed: no verified on-demand L40S price was found in the
reference material, so L40S is left out rather than guessed. GPU prices are ranges (the source
gives ranges across providers); the report shows their break-even throughput against the API
prices, since this run measures throughput on the CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HourlyPrice:
    hardware: str
    low_usd_h: float
    high_usd_h: float
    note: str
    source: str
    date: str  # as stated by the source


@dataclass(frozen=True, slots=True)
class ApiPrice:
    model: str
    output_usd_per_million: float
    source: str
    date: str


# The machines these reports run on: 2 shared vCPUs. The closest on-demand general-purpose
# instance is AWS m7i.large (2 vCPU, 8 GiB, Xeon 4th gen), priced as half the cited m7i.xlarge.
CPU = HourlyPrice(
    hardware="CPU, 2 vCPU (AWS m7i.large, us-east-1, Linux on-demand)",
    low_usd_h=0.1008,
    high_usd_h=0.1008,
    note="half of the cited m7i.xlarge (4 vCPU) price of $0.2016/h; sizes in a family scale linearly",
    source="https://c3x.dev/blog/m5-vs-m6i-vs-m7i-cost-performance",
    date="2026",
)

GPUS = (
    HourlyPrice(
        "NVIDIA H100 SXM5 80GB (1 GPU)", 3.50, 5.00,
        "hyperscaler on-demand range per GPU-hour",
        "https://www.mercatus-ai.com/blog/cloud-gpu-pricing", "2026-05",
    ),
    HourlyPrice(
        "NVIDIA H200 SXM5 141GB (1 GPU)", 4.50, 7.00,
        "hyperscaler on-demand range per GPU-hour",
        "https://www.mercatus-ai.com/blog/cloud-gpu-pricing", "2026-05",
    ),
    HourlyPrice(
        "NVIDIA A100 80GB (1 GPU)", 1.50, 3.00,
        "hyperscaler on-demand range per GPU-hour",
        "https://www.mercatus-ai.com/blog/cloud-gpu-pricing", "2026-05",
    ),
)  # fmt: skip

APIS = (
    ApiPrice(
        "OpenAI GPT-4o mini", 0.60,
        "https://openai.com/api/pricing/ (as tabulated in github.com/kunishou/GenerativeAI-Cost and "
        "re-verified at raw.githubusercontent.com/Sraleik/undetermini/HEAD/PRICING.md)", "2026-05-07",
    ),
    ApiPrice(
        "Anthropic Claude 3 Haiku", 1.25,
        "https://opencode.ai/data/anthropic/claude-3-haiku-20240307.json", "2024-03-13 (list price)",
    ),
    ApiPrice(
        "Anthropic Claude Sonnet 4.5", 15.00,
        "https://docs.rs/cogito-claude (table 'as of 25 November 2025', from Anthropic's pricing docs)",
        "2025-11-25",
    ),
)  # fmt: skip
