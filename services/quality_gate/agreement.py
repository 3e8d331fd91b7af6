"""Token agreement with the target: `exact` (top-1) and `topk5` (seed 000's default)."""

from __future__ import annotations

from pydantic import JsonValue

from speccore.engine import Engine
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference, describe

TOP_K = 5
GREEDY = SamplingParams()


def exact(ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float) -> GateOutcome:
    """Share of output positions where the candidate's greedy token equals the target's own.

    Always greedy, whatever the plan samples with: sampled outputs of two lossless
    engines differ token by token, greedy ones must not. Positions past the
    shorter output count as disagreements, so stopping early or late fails too.
    """
    prompts = ref.prompts()
    ids = [p.token_ids for p in prompts]
    n_new = ref.sample.max_new_tokens
    target_out = [g.token_ids for g in ref.baseline("prompts", ids, n_new, GREEDY)]
    spec_out = [g.token_ids for g in ref.generate(engine, ids, n_new, GREEDY)]

    matched = compared = identical = 0
    worst: dict[str, JsonValue] | None = None
    lowest = float("inf")
    for prompt, want, got in zip(prompts, target_out, spec_out, strict=True):
        length = max(len(want), len(got))
        same = sum(a == b for a, b in zip(want, got, strict=False))
        matched += same
        compared += length
        identical += want == got
        agreement = same / length if length else 1.0
        if agreement < lowest:
            lowest = agreement
            worst = {
                "prompt_id": prompt.id,
                "agreement": agreement,
                "first_divergence": _first_divergence(want, got),
            }
    score = matched / compared if compared else 1.0
    return GateOutcome(
        method=GateMethod.EXACT,
        passed=score >= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": "greedy",
            "prompts": len(prompts),
            "tokens_compared": compared,
            "identical_prompts": identical,
            "worst_prompt": worst,
        },
    )


def topk5(ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float) -> GateOutcome:
    """Share of the candidate's tokens inside the target's top 5 at their position.

    The candidate generates with the plan's sampling; the target then reads the
    candidate's output teacher-forced, decoding one token at a time.
    """
    prompts = ref.prompts()
    ids = [p.token_ids for p in prompts]
    n_new = ref.sample.max_new_tokens
    outputs = [g.token_ids for g in ref.generate(engine, ids, n_new, sampling)]

    hits = total = 0
    worst: dict[str, JsonValue] | None = None
    lowest = float("inf")
    for i, logits in ref.plain_logits(ids, outputs, n_new):
        if not outputs[i]:
            continue
        top = logits.topk(TOP_K, dim=-1).indices  # [len, TOP_K]
        inside = (top == logits.new_tensor(outputs[i], dtype=top.dtype)[:, None]).any(-1)
        n_in = int(inside.sum())
        hits += n_in
        total += len(outputs[i])
        share = n_in / len(outputs[i])
        if share < lowest:
            lowest = share
            outside = (~inside).nonzero().flatten().tolist()
            worst = {
                "prompt_id": prompts[i].id,
                "share": share,
                "first_outside": outside[0] if outside else None,
            }
    score = hits / total if total else 1.0
    return GateOutcome(
        method=GateMethod.TOPK5,
        passed=score >= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": describe(sampling),
            "prompts": len(prompts),
            "tokens": total,
            "outside_top5": total - hits,
            "worst_prompt": worst,
        },
    )


def _first_divergence(want: list[int], got: list[int]) -> int | None:
    for pos, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return pos
    return None if len(want) == len(got) else min(len(want), len(got))
