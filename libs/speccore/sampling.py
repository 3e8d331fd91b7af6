"""Target/draft distributions from logits: temperature, top-k, top-p, min-p.

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
    min_p: float = 0.0  # vLLM's: drop tokens less likely than min_p times the likeliest

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise SpecError(f"min-p must be in [0, 1], got {self.min_p}")

    @classmethod
    def of(cls, given: GivenSampling, *, min_p: float = 0.0) -> SamplingParams:
        """speccore's sampling for one given elsewhere; OpenAI/vLLM's top_k -1 (disabled) is 0."""
        return cls(given.temperature, max(given.top_k, 0), given.top_p, min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution actually sampled from, after temperature, top-k, top-p and min-p (in
    vLLM's order: min-p on the tempered distribution, before top-k and top-p).

    logits: [..., vocab]; returns float32 probabilities of the same shape.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    scaled = logits.float() / params.temperature
    if params.min_p > 0.0:
        probs = scaled.softmax(-1)
        floor = params.min_p * probs.amax(-1, keepdim=True)
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
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


def ban_early_stops(logits: torch.Tensor, parents: list[int], room: int, banned: list[int]) -> None:
    """vLLM's min_tokens on one row's block, in place: the ``banned`` (stopping) tokens get -inf
    logits at every node whose next token would be among the first ``room`` still owed.

    logits: [q, vocab] at the block's nodes; ``parents``: each node's parent (root -1), parents
    first. A node at depth d draws the (d + 1)-th token of the step, so it is masked while
    d < room. Masking the target's logits before the verifier reads them keeps decoding
    lossless: greedy takes the masked argmax, sampling accepts and resamples from the masked
    distribution, so a drafted stop token there is always rejected.
    """
    depth: list[int] = []
    for parent in parents:
        depth.append(depth[parent] + 1 if parent >= 0 else 0)
    nodes = [node for node, d in enumerate(depth) if d < room]
    if nodes and banned:
        rows = torch.tensor(nodes).unsqueeze(1)
        logits[rows, torch.tensor(banned)] = float("-inf")
