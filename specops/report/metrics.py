"""The engine server's spec-decode counters (`specops:spec_decode_*`, vLLM's semantics), read
from `/metrics` before and after a load level: the difference is that level's acceptance."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

_PREFIX = "specops:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass(frozen=True, slots=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted_tokens - other.accepted_tokens,
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (vLLM's draft acceptance rate)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per drafting step: 1 (the target's own token) + accepted drafts per draft."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


def parse_counters(text: str) -> SpecCounters:
    """The three spec-decode counters of a Prometheus exposition, summed over labels."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(_PREFIX).removesuffix("_total")
            if sample.name.startswith(_PREFIX) and sample.name.endswith("_total") and name in totals:
                totals[name] += sample.value
    return SpecCounters(totals["num_drafts"], totals["num_draft_tokens"], totals["num_accepted_tokens"])


def scrape(base_url: str) -> SpecCounters:
    response = httpx.get(f"{base_url}/metrics", timeout=30)
    response.raise_for_status()
    return parse_counters(response.text)
