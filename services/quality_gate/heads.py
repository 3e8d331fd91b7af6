"""The gate of a trained T3 head: the held-out prompts decoded greedily by the target alone
(`none`) and with the head, interleaved (speccore.bench's protocol), compared token for token.

- lossless: in every rep, the head's greedy output equals `none`'s on every prompt;
- acceptance: accepted / drafted tokens over every rep (speccore's GenerationMetrics);
- speedup: the median over reps of the head's tokens/s over `none`'s in the same rep.

Pass iff lossless, acceptance_rate >= gate.min_acceptance, and speedup >= gate.min_speedup
when one is asked; the reason names the numbers. Pure but for the decoding: the caller
loads the target and the prompts and takes the device's host lock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speccatalog import families
from speccore.bench import RepRun, Schedule, engine_method, interleave
from speccore.engine import Engine
from speccore.errors import SpecError
from speccore.heads.artifact import read_config
from speccore.metrics import GenerationMetrics
from speccore.models import LoadedModel
from speccore.proposers.base import ProposerConfig
from speccore.split import HELDOUT_FRACTION, is_heldout
from speccore.training.data import read_examples
from speccore.training.run import hardware
from specops_schemas.heads import HeadGateResult, HeadGateSpec

HEAD, NONE = "head", "none"


class HeadUnusable(SpecError):
    """The head cannot be decoded with on this target (wrong shapes, a broken file, ...)."""


@dataclass(frozen=True, slots=True)
class HeadMethod:
    """How speccore decodes a head artifact: its method and draft depth."""

    method: str
    k: int


def head_method(head_dir: Path) -> HeadMethod:
    """The speccore method decoding the head in ``head_dir`` (the catalog family whose
    head_artifacts hold its family), drafting as deep as the head was trained for."""
    config = read_config(head_dir)
    for spec in families.families().values():
        if config.family in spec.head_artifacts:
            return HeadMethod(spec.name, max(1, int(config.num_heads)))
    raise HeadUnusable(f"{head_dir}: no speccore method decodes a {config.family} head")


def heldout_prompts(root: Path, train_path: str, heldout_path: str | None, n: int) -> list[str]:
    """The first ``n`` held-out prompts: the held-out JSONL's, or, without one, the training
    set's held-out share by prompt hash (speccore.split.is_heldout, as training split it)."""
    if heldout_path is not None:
        prompts = [ex.prompt for ex in read_examples(root / heldout_path)]
    else:
        prompts = [
            ex.prompt for ex in read_examples(root / train_path) if is_heldout(ex.prompt, HELDOUT_FRACTION)
        ]
    unique = list(dict.fromkeys(prompts))
    if not unique:
        where = heldout_path or f"the {HELDOUT_FRACTION:.0%} held-out share of {train_path}"
        raise SpecError(f"no held-out prompt to gate on in {where}")
    return unique[:n]


def evaluate_head(
    target: LoadedModel, head_dir: Path, gate: HeadGateSpec, prompts: Sequence[str], *, chat: bool = True
) -> HeadGateResult:
    """Decode ``prompts`` with `none` and with the head, ``gate.reps`` interleaved reps, greedy.

    Raises HeadUnusable when the head does not load or its decoding fails on this target."""
    how = head_method(head_dir)
    ids = [target.encode_prompt(p, chat) for p in prompts[: gate.n_prompts]]
    try:
        engine = Engine(target, how.method, ProposerConfig(k=how.k, head=str(head_dir)))
    except (SpecError, OSError, RuntimeError, ValueError, KeyError) as err:
        raise HeadUnusable(f"the head does not load on {target.ref}: {err}") from err
    schedule = Schedule(prompts=ids, reps=gate.reps, max_new_tokens=gate.max_new_tokens, batch_size=1)
    runs: list[RepRun] = []
    methods = {NONE: engine_method(Engine(target, "none")), HEAD: engine_method(engine)}
    failures = interleave(schedule, methods, runs.append, baseline=NONE)
    if HEAD in failures:
        raise HeadUnusable(f"decoding with the head failed on {target.ref}: {failures[HEAD]}")
    return verdict(runs, gate, n_prompts=len(ids), hardware=hardware(target))


def verdict(runs: Sequence[RepRun], gate: HeadGateSpec, *, n_prompts: int, hardware: str) -> HeadGateResult:
    """The gate's result from the measured reps (each rep: `none`'s run, then the head's)."""
    base = {r.rep: r for r in runs if r.method == NONE}
    head = {r.rep: r for r in runs if r.method == HEAD}
    if not head or set(head) != set(base):
        raise HeadUnusable("the head was not measured in every rep")
    mismatched = sum(
        1
        for rep, run in head.items()
        for mine, theirs in zip(run.token_ids, base[rep].token_ids, strict=True)
        if mine != theirs
    )
    lossless = mismatched == 0
    total = _total([m for run in head.values() for m in run.metrics])
    acceptance = total.acceptance_rate
    speedup = statistics.median(run.speedup or 0.0 for run in head.values())
    tps = statistics.median(run.tokens_per_s for run in head.values())
    base_tps = statistics.median(run.tokens_per_s for run in base.values())
    passed, reason = decide(
        gate, lossless=lossless, mismatched=mismatched, acceptance=acceptance, speedup=speedup
    )
    return HeadGateResult(
        passed=passed,
        reason=reason,
        lossless=lossless,
        acceptance_rate=min(1.0, max(0.0, acceptance)),
        mean_acceptance_length=total.mean_acceptance_length,
        speedup=speedup,
        tokens_per_s=tps,
        baseline_tokens_per_s=base_tps,
        n_prompts=n_prompts,
        max_new_tokens=gate.max_new_tokens,
        hardware=hardware,
    )


def decide(
    gate: HeadGateSpec, *, lossless: bool, mismatched: int, acceptance: float, speedup: float
) -> tuple[bool, str]:
    """Pass iff lossless and the thresholds hold; the reason names every number compared."""
    problems = []
    if not lossless:
        problems.append(
            f"not lossless: {mismatched} prompt decodings differ from the target's own greedy output"
        )
    if acceptance < gate.min_acceptance:
        problems.append(f"acceptance rate {acceptance:.3f} < min_acceptance {gate.min_acceptance:.3f}")
    if gate.min_speedup is not None and speedup < gate.min_speedup:
        problems.append(f"speedup {speedup:.2f}x < min_speedup {gate.min_speedup:.2f}x")
    if problems:
        return False, "; ".join(problems)
    need = f" >= min_speedup {gate.min_speedup:.2f}x" if gate.min_speedup is not None else " (not required)"
    return True, (
        f"lossless; acceptance rate {acceptance:.3f} >= min_acceptance {gate.min_acceptance:.3f}; "
        f"speedup {speedup:.2f}x{need}"
    )


def _total(ms: Sequence[GenerationMetrics]) -> GenerationMetrics:
    total = GenerationMetrics()
    for m in ms:
        total.verify_steps += m.verify_steps
        total.drafted_tokens += m.drafted_tokens
        total.accepted_tokens += m.accepted_tokens
    return total
