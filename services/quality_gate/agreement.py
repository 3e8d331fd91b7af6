"""Token agreement with the target: `exact` (top-1) and `topk5` (the default)."""

from __future__ import annotations

from pydantic import JsonValue

from speccore.engine import Engine
from speccore.sampling import SamplingParams, probs_from_logits
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
    """Top-5 agreement: the candidate's tokens inside the target's top 5, against the
    share the target's own sampler puts there.

    The candidate generates with the plan's sampling; the target then reads the
    candidate's output teacher-forced, decoding one token at a time. Greedy, the
    score is the share of tokens inside the target's top 5 (1.0 when lossless).
    Sampled, even the target itself emits tokens outside its top 5 (at T=0.7 a few
    percent of them), so an absolute share would fail lossless candidates: the score
    is the number of tokens inside divided by the number the target's sampling
    distribution puts there in expectation at the same positions (the sum of its
    top-5 mass). A lossless candidate scores 1 up to sampling noise; a rule that
    accepts tokens the target would rarely emit scores below.
    """
    prompts = ref.prompts()
    ids = [p.token_ids for p in prompts]
    n_new = ref.sample.max_new_tokens
    outputs = [g.token_ids for g in ref.generate(engine, ids, n_new, sampling)]

    hits = total = 0
    expected = 0.0
    worst: dict[str, JsonValue] | None = None
    lowest = float("inf")
    for i, logits in ref.plain_logits(ids, outputs, n_new):
        if not outputs[i]:
            continue
        top = logits.topk(TOP_K, dim=-1).indices  # [len, TOP_K]
        inside = (top == logits.new_tensor(outputs[i], dtype=top.dtype)[:, None]).any(-1)
        mass = probs_from_logits(logits, sampling).gather(-1, top).sum(-1)  # [len]
        n_in = int(inside.sum())
        hits += n_in
        total += len(outputs[i])
        expected += float(mass.sum())
        share = n_in / len(outputs[i])
        if share < lowest:
            lowest = share
            outside = (~inside).nonzero().flatten().tolist()
            worst = {
                "prompt_id": prompts[i].id,
                "share": share,
                "first_outside": outside[0] if outside else None,
            }
    score = hits / expected if expected else 1.0
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
            "share_inside_top5": hits / total if total else 1.0,
            "target_expected_share": expected / total if total else 1.0,
            "worst_prompt": worst,
        },
    )


def _first_divergence(want: list[int], got: list[int]) -> int | None:
    for pos, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return pos
    return None if len(want) == len(got) else min(len(want), len(got))
