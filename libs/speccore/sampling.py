"""Target/draft distributions from logits: temperature, top-k, top-p.

Greedy decoding is temperature 0; every other setting produces a proper
probability distribution that the verifier can compare between draft and target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from speccore.errors import SpecError


class GivenSampling(Protocol):
    """Sampling as a request, a plan or the command line gives it."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecError(f"top-p must be in (0, 1], got {self.top_p}")

    @classmethod
    def of(cls, given: GivenSampling) -> SamplingParams:
        """speccore's sampling for one given elsewhere; OpenAI/vLLM's top_k -1 (disabled) is 0."""
        return cls(given.temperature, max(given.top_k, 0), given.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution actually sampled from, after temperature, top-k and top-p.

    logits: [..., vocab]; returns float32 probabilities of the same shape.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    scaled = logits.float() / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token once the mass before it already reaches top_p; the first token always stays.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
