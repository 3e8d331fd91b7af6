"""An HTTP engine's speculative-decoding counts, read from its Prometheus ``/metrics`` text.

vLLM and ``specops serve engine`` export the same counters under their own prefix
(``vllm:``, ``specops:``): ``spec_decode_num_drafts``,
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens`` and
``spec_decode_num_accepted_tokens_per_pos{position}``, each with ``_total``. A draft is
one row-step that drafted at least one token; accepted at position i counts the drafts
whose accepted length is over i. The counts of a stretch of decoding are the
difference of two scrapes (:func:`delta`), summed over every label set but
``position`` (one server serves one model).

SGLang has no such counters (``python/sglang/srt/metrics/collector.py`` at commit
93d04878cfb9b08645fae7b11bd340ee33b34acf): only the gauges ``sglang:spec_accept_rate``
and ``sglang:spec_accept_length`` of its last logged batch. Its counts are left at
zero and :func:`gauges` reads those two instead.

Pure: text in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "spec_decode_num_drafts"
DRAFT_TOKENS = "spec_decode_num_draft_tokens"
ACCEPTED = "spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "spec_decode_num_accepted_tokens_per_pos"
SGLANG_RATE = "sglang:spec_accept_rate"
SGLANG_LENGTH = "sglang:spec_accept_length"


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """Spec-decode counter values (totals of one scrape, or the difference of two)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # index = position

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per drafting step, the target's own token included (vLLM's definition)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 0.0


def spec_counts(text: str, prefix: str) -> SpecCounts:
    """The spec-decode counters under ``prefix`` (``vllm:``, ``specops:``) in a /metrics text.

    A counter the engine does not export (speculation off, SGLang) reads zero.
    """
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix(prefix) if family.name.startswith(prefix) else None
        if name not in (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # the _created timestamps of a counter
            if name == ACCEPTED_PER_POS:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            else:
                totals[name] = totals.get(name, 0.0) + sample.value
    width = max(per_pos) + 1 if per_pos else 0
    return SpecCounts(
        drafts=round(totals.get(DRAFTS, 0.0)),
        draft_tokens=round(totals.get(DRAFT_TOKENS, 0.0)),
        accepted_tokens=round(totals.get(ACCEPTED, 0.0)),
        accepted_per_position=[round(per_pos.get(i, 0.0)) for i in range(width)],
    )


def delta(before: SpecCounts, after: SpecCounts) -> SpecCounts:
    """What was counted between two scrapes of one server; a restart between them raises."""
    width = max(len(before.accepted_per_position), len(after.accepted_per_position))
    pad = [0] * width
    first = [*before.accepted_per_position, *pad][:width]
    last = [*after.accepted_per_position, *pad][:width]
    out = SpecCounts(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted_tokens=after.accepted_tokens - before.accepted_tokens,
        accepted_per_position=[b - a for a, b in zip(first, last, strict=True)],
    )
    if min(out.drafts, out.draft_tokens, out.accepted_tokens, *out.accepted_per_position, 0) < 0:
        raise ValueError("a spec-decode counter went down between two scrapes: the engine restarted")
    return out


def gauges(text: str, names: tuple[str, ...] = (SGLANG_RATE, SGLANG_LENGTH)) -> dict[str, float]:
    """The value of each gauge of ``names`` found in a /metrics text (the last sample of each)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names and family.samples:
            found[family.name] = family.samples[-1].value
    return found
