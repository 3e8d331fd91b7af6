"""`logit_kl`: mean KL(target || spec) per emitted token.

spec: the distribution the speculative engine chose each emitted token from —
the verify pass's target logits at that token's node (one tree-masked block
forward over a KV cache that has been rolled back and compacted), handed out by
``Engine.generate(on_logits=...)``. target: the target's distribution for the
same prefix from plain decoding, one token per forward pass. Both are softmaxes
at the plan's temperature (1 when greedy) before top-k / top-p: truncation is the
same function of the logits on both sides and would only turn tiny differences
into infinite ones.

This checks the verify pass's numerics (batching, tree attention, cache
compaction, kernels), where lossless engines drift in practice. The logits alone
do not show the acceptance rule: when greedy, a token that is not the verify
pass's argmax was not drawn from that distribution at all (its real "spec" is a
point mass, an infinite KL), so any such token (``emitted_off_argmax``) fails the
method whatever the mean. Under sampling a lossy rule is only visible in
distribution; `exact` and `topk5` gate the rule.
"""

from __future__ import annotations

import torch
from pydantic import JsonValue

from speccore.engine import Engine, LogitsCallback
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference, describe


def kl_per_position(
    target_logits: torch.Tensor, spec_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[n] KL(softmax(target / T) || softmax(spec / T)) in nats."""
    log_p = torch.log_softmax(target_logits.double() / temperature, -1)
    log_q = torch.log_softmax(spec_logits.double() / temperature, -1)
    # Rounding can leave a hair below zero where the two are equal.
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)


def logit_kl(ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float) -> GateOutcome:
    prompts = ref.prompts()
    ids = [p.token_ids for p in prompts]
    n_new = ref.sample.max_new_tokens
    temperature = 1.0 if sampling.greedy else sampling.temperature

    kl_sum = 0.0
    positions = off_argmax = 0
    worst: dict[str, JsonValue] | None = None
    highest = -1.0
    # One batch at a time: the spec logits of a batch are [tokens, vocab] floats per prompt.
    size = ref.sample.batch_size
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        seen: list[list[torch.Tensor]] = [[] for _ in chunk]
        generations = ref.generate(engine, chunk, n_new, sampling, _collect_into(seen), first=start)
        outputs = [g.token_ids for g in generations]
        for row, target_logits in ref.plain_logits(chunk, outputs, n_new):
            out = outputs[row]
            if not out:
                continue
            spec_logits = torch.cat(seen[row])[: len(out)]
            if spec_logits.shape[0] != len(out):
                raise RuntimeError("the engine reported fewer verify logits than emitted tokens")
            kl = kl_per_position(target_logits, spec_logits, temperature)
            kl_sum += float(kl.sum())
            positions += len(out)
            if sampling.greedy:
                off_argmax += int((spec_logits.argmax(-1) != torch.tensor(out)).sum())
            if float(kl.max()) > highest:
                highest = float(kl.max())
                worst = {
                    "prompt_id": prompts[start + row].id,
                    "max_kl": highest,
                    "position": int(kl.argmax()),
                }
    score = kl_sum / positions if positions else 0.0
    return GateOutcome(
        method=GateMethod.LOGIT_KL,
        passed=score <= threshold and off_argmax == 0,
        score=score,
        threshold=threshold,
        details={
            "decoding": describe(sampling),
            "temperature": temperature,
            "prompts": len(prompts),
            "tokens": positions,
            "max_kl": max(highest, 0.0),
            "emitted_off_argmax": off_argmax if sampling.greedy else None,
            "worst_prompt": worst,
        },
    )


def _collect_into(seen: list[list[torch.Tensor]]) -> LogitsCallback:
    def collect(row: int, logits: torch.Tensor) -> None:
        seen[row].append(logits)

    return collect
