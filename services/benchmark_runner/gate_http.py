"""What the quality gate decides on, measured on a bench's engine servers while they run.

The gate service decodes on speccore in its own process; it cannot reach a bench's vLLM
or SGLang servers, which live only as long as the bench. So for a plan measured over
HTTP the benchmark-runner, after the reps, gathers the evidence of the plan's gate
method on the servers, and the gate judges it (quality_gate.logic):

- `exact`: every server decodes the prompts greedily, one at a time; per candidate,
  the share of prompts whose text is the baseline's (`Measurement.greedy_agreement`).
- `topk5` (vLLM): each candidate decodes the prompts with the plan's sampling (its
  server returns the token ids); the baseline server then reads prompt + output
  teacher-forced and reports the target's 20 most likely tokens at every position
  (`prompt_logprobs`). A token counts as inside when its rank there is at most 5;
  the expected count is what the target's own sampling would put inside
  (`Measurement.top5`, see Top5Evidence).
- `mmlu_slice` and `constraint_violation` (vLLM, SGLang): every server's answers and
  JSON replies (measure_http; `Measurement.mmlu`, `Measurement.structured`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from speccore.sampling import SamplingParams
from specops_schemas.candidates import Top5Evidence

TOP_K = 5
# vLLM's default --max-logprobs: the most tokens its prompt_logprobs reports per position.
REPORTED = 20


@dataclass(frozen=True, slots=True)
class Scored:
    """One output read teacher-forced by the baseline: per token, its rank among the target's
    tokens (None: below the reported ones) and the target's top-5 share under the sampling."""

    ranks: list[int | None]
    top5_mass: list[float]


def top5_mass(logprobs: Sequence[float], sampling: SamplingParams) -> float:
    """The share the sampled distribution puts on the 5 most likely tokens, from the target's
    most likely tokens' raw log-probabilities (descending; the rest of the vocabulary is left
    out, which can only raise the share). 1 when greedy."""
    if sampling.greedy:
        return 1.0
    scaled = [lp / sampling.temperature for lp in logprobs]
    if sampling.top_k:
        scaled = scaled[: sampling.top_k]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    if sampling.top_p < 1.0:  # the nucleus: the fewest tokens whose mass reaches top_p
        kept, mass = [], 0.0
        for p in probs:
            kept.append(p)
            mass += p
            if mass >= sampling.top_p:
                break
        probs = [p / mass for p in kept]
    return sum(probs[:TOP_K])


def score_positions(
    entries: Sequence[Mapping[str, Any] | None], output: Sequence[int], sampling: SamplingParams
) -> Scored:
    """``entries``: vLLM's prompt_logprobs at the output's positions (token id -> logprob and
    rank, the output's own token always among them)."""
    ranks: list[int | None] = []
    masses: list[float] = []
    for token, entry in zip(output, entries, strict=True):
        if entry is None:
            raise ValueError("the baseline server reported no log-probabilities for an output position")
        own = entry.get(str(token))
        ranks.append(int(own["rank"]) if own is not None else None)
        ordered = sorted((e for e in entry.values()), key=lambda e: int(e["rank"]))
        top = [float(e["logprob"]) for e in ordered if int(e["rank"]) <= REPORTED]
        masses.append(top5_mass(top, sampling))
    return Scored(ranks, masses)


def top5_evidence(scored: Sequence[Scored]) -> Top5Evidence:
    tokens = sum(len(s.ranks) for s in scored)
    inside = [sum(r is not None and r <= TOP_K for r in s.ranks) for s in scored]
    shares = [n / len(s.ranks) for n, s in zip(inside, scored, strict=True) if s.ranks]
    return Top5Evidence(
        prompts=len(scored),
        tokens=tokens,
        inside_top5=sum(inside),
        expected_inside_top5=sum(sum(s.top5_mass) for s in scored),
        worst_prompt_share=min(shares, default=1.0),
    )


class TeacherForcing:
    """The baseline vLLM server reading token ids teacher-forced."""

    def __init__(self, url: str, model: str, timeout_s: float) -> None:
        self.url = url
        self.model = model
        self.timeout_s = timeout_s

    def entries(self, prompt_ids: Sequence[int], output: Sequence[int]) -> list[Mapping[str, Any] | None]:
        """prompt_logprobs at the output's positions."""
        body = {
            "model": self.model,
            "prompt": [*prompt_ids, *output],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": REPORTED,
        }
        response = httpx.post(f"{self.url}/v1/completions", json=body, timeout=self.timeout_s)
        response.raise_for_status()
        found = response.json()["choices"][0]["prompt_logprobs"]
        return list(found[len(prompt_ids) :])
