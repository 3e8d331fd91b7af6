"""Interleaved, warmed-up benchmark of decoding methods on one prompt set.

Every method sees the same prompts in the same repetition, in a rotating order,
so machine noise hits all of them alike; speedups are ratios to ``none`` measured
inside each repetition, then the median across repetitions. The Hugging Face
baselines (``hf*``) run ``generate`` on a stock copy of the model, as its users
run it; on CPU speccore's own copy runs the row-invariant kernels.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from speccore import __version__
from speccore.bandwidth import decode_limit_tokens_per_s, measure_read_bandwidth
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.heads.loading import head_for
from speccore.hf_baselines import HF_DEFAULT_K, HF_METHODS, HFGenerator
from speccore.metrics import GenerationMetrics
from speccore.models import LoadedModel, load_model
from speccore.proposers import default_k
from speccore.proposers.base import ProposerConfig
from speccore.sampling import SamplingParams


@dataclass(slots=True)
class BenchSpec:
    workload: str
    methods: list[str]
    n_prompts: int = 10
    max_new_tokens: int = 128
    reps: int = 3
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    batch_size: int = 1
    k: int | None = None
    draft: str | None = None
    datastore: str | None = None
    heads: tuple[str, ...] = ()  # head directories; medusa and eagle each take the one they decode
    prompts: str | None = None  # JSONL of {"prompt", "completion"} lines used instead of the workload's
    tree: dict[str, Any] = field(default_factory=dict)  # ProposerConfig tree fields for medusa/eagle

    def __post_init__(self) -> None:
        if "none" not in self.methods:
            self.methods.insert(0, "none")
        if len(set(self.methods)) != len(self.methods):
            raise SpecError("a method is listed twice")
        if self.reps <= 0 or self.n_prompts <= 0 or self.batch_size <= 0:
            raise SpecError("--reps, --n-prompts and --batch-size must be positive")


class BenchPrompt(Protocol):
    """A prompt to measure on (specprompts.sources.Prompt is one)."""

    id: str
    text: str
    chat: bool  # wrap in the model's chat template


Runner = Callable[[list[list[int]], int], tuple[list[list[int]], list[GenerationMetrics], float]]


def _engine_runner(engine: Engine, spec: BenchSpec) -> Runner:
    def run(prompts: list[list[int]], seed: int) -> tuple[list[list[int]], list[GenerationMetrics], float]:
        reqs = [Request(p, spec.max_new_tokens, spec.sampling, seed + i) for i, p in enumerate(prompts)]
        start = time.perf_counter()
        gens = engine.generate(reqs)
        return [g.token_ids for g in gens], [g.metrics for g in gens], time.perf_counter() - start

    return run


def _hf_runner(hf: HFGenerator, spec: BenchSpec) -> Runner:
    def run(prompts: list[list[int]], seed: int) -> tuple[list[list[int]], list[GenerationMetrics], float]:
        start = time.perf_counter()
        outs = [hf.generate(p, spec.max_new_tokens, spec.sampling, seed + i) for i, p in enumerate(prompts)]
        return outs, [], time.perf_counter() - start

    return run


def stock_twin(target: LoadedModel) -> LoadedModel:
    """The target as Hugging Face users run it: on CPU a second copy with the stock
    kernels (speccore's own copy runs row-invariant ones), elsewhere the same model."""
    if target.device.type != "cpu":
        return target
    dtype = str(target.dtype).removeprefix("torch.")
    return load_model(target.ref, device="cpu", dtype=dtype, row_invariant=False)


def build_runners(target: LoadedModel, spec: BenchSpec) -> dict[str, Runner]:
    runners: dict[str, Runner] = {}
    stock: LoadedModel | None = None
    for method in spec.methods:
        if method in HF_METHODS:
            k = spec.k or HF_DEFAULT_K.get(method, 1)
            stock = stock or stock_twin(target)
            runners[method] = _hf_runner(HFGenerator(method, stock, k, spec.draft), spec)
            continue
        k = spec.k or default_k(method)
        head = head_for(method, spec.heads, target.ref)
        cfg = ProposerConfig(k=k, draft=spec.draft, datastore=spec.datastore, head=head, **spec.tree)
        runners[method] = _engine_runner(Engine(target, method, cfg), spec)
    return runners


def run_bench(
    target: LoadedModel,
    spec: BenchSpec,
    prompts: Sequence[BenchPrompt],
    log: Callable[[str], None] = print,
) -> dict[str, object]:
    """Measure every method of `spec` on `prompts` (a rest method needs spec.datastore)."""
    if "rest" in spec.methods and spec.datastore is None:
        raise SpecError("the rest method needs a datastore")
    encoded = [target.encode_prompt(p.text, p.chat) for p in prompts]
    batches = [encoded[i : i + spec.batch_size] for i in range(0, len(encoded), spec.batch_size)]
    runners = build_runners(target, spec)

    for method, run in runners.items():  # warm-up: allocator, kernels, caches
        log(f"warm-up {method}")
        run([encoded[0][:64]], spec.seed)

    tokens = {m: [0] * spec.reps for m in runners}
    seconds = {m: [0.0] * spec.reps for m in runners}
    outputs: dict[str, list[list[int]]] = {m: [] for m in runners}
    metrics: dict[str, list[GenerationMetrics]] = {m: [] for m in runners}
    identical = {m: True for m in runners}
    order = list(runners)
    for rep in range(spec.reps):
        for b, batch in enumerate(batches):
            shift = (rep + b) % len(order)
            for method in order[shift:] + order[:shift]:
                outs, ms, dt = runners[method](batch, spec.seed + b * spec.batch_size)
                tokens[method][rep] += sum(len(o) for o in outs)
                seconds[method][rep] += dt
                if rep == 0:
                    outputs[method].extend(outs)
                    metrics[method].extend(ms)
            log(f"rep {rep + 1}/{spec.reps} batch {b + 1}/{len(batches)} done")
        for method in order:
            if outputs[method][: len(outputs["none"])] != outputs["none"]:
                identical[method] = False

    bandwidth = measure_read_bandwidth()
    none_tps = [t / s for t, s in zip(tokens["none"], seconds["none"], strict=True)]
    results: dict[str, dict[str, Any]] = {}
    for method in order:
        tps = [t / s for t, s in zip(tokens[method], seconds[method], strict=True)]
        results[method] = {
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s_reps": tps,
            "speedup_vs_none": statistics.median(t / n for t, n in zip(tps, none_tps, strict=True)),
            "new_tokens": tokens[method][0],
            **_acceptance(metrics[method]),
            **({"identical_to_baseline": identical[method]} if spec.sampling.greedy else {}),
        }
    if spec.batch_size == 1:
        _add_free_drafting_limits(results, seconds["none"][0])
    return {
        "speccore_version": __version__,
        "machine": _machine(),
        "model": target.ref,
        "weight_bytes": target.weight_bytes,
        "spec": {**asdict(spec), "sampling": asdict(spec.sampling)},
        "prompt_ids": [p.id for p in prompts],
        "plain_decoding_limit": {
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "tokens_per_s": decode_limit_tokens_per_s(target.weight_bytes, bandwidth),
        },
        "methods": results,
    }


def _add_free_drafting_limits(results: dict[str, dict[str, Any]], none_seconds: float) -> None:
    """Per speccore method, the speedup its verify steps would give if drafting were free
    and verifying its block cost one plain decoding step: what its acceptance alone
    allows, prefill included. From the first repetition at batch 1, where ``none``'s
    verify time is its decoding time:
    none_seconds / (none_seconds - verify_none * (1 - steps / steps_none)).
    """
    none = results["none"]
    step_s = none["verify_time_s"] / none["verify_steps"]
    for m in results.values():
        if "verify_steps" in m:
            saved = (none["verify_steps"] - m["verify_steps"]) * step_s
            m["free_drafting_limit"] = none_seconds / (none_seconds - saved)


def _acceptance(ms: list[GenerationMetrics]) -> dict[str, object]:
    if not ms:
        return {}
    total = GenerationMetrics()
    for m in ms:
        total.verify_steps += m.verify_steps
        total.drafted_tokens += m.drafted_tokens
        total.accepted_tokens += m.accepted_tokens
        width = max(len(total.drafted_per_position), len(m.drafted_per_position))
        for name in ("drafted_per_position", "accepted_per_position"):
            acc = getattr(total, name) + [0] * (width - len(getattr(total, name)))
            for i, v in enumerate(getattr(m, name)):
                acc[i] += v
            setattr(total, name, acc)
    return {
        "verify_steps": total.verify_steps,
        "acceptance_rate": total.acceptance_rate,
        "mean_acceptance_length": total.mean_acceptance_length,
        "per_position_acceptance": total.per_position_acceptance,
        "draft_time_s": sum(m.draft_time_s for m in ms),
        "verify_time_s": sum(m.verify_time_s for m in ms),
        "extra_memory_bytes": max(m.extra_memory_bytes for m in ms),
    }


def _machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        # Idle OpenMP threads spin for a while by default, or sleep at once under PASSIVE.
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
    }


def default_output(spec: BenchSpec, model: str) -> Path:
    name = f"{model}-{spec.workload}-t{spec.sampling.temperature:g}-b{spec.batch_size}.json"
    return Path("bench/results") / name.replace("/", "_")
