"""The one measuring protocol: interleaved, warmed-up repetitions of decoding methods.

Every method decodes the same prompts in the same repetition (rep), batch after
batch, in an order that rotates with the rep and the batch, so machine noise hits
all of them alike; before the first rep each method decodes once to warm up its
allocator, kernels and caches. A method's speedup in a rep is its tokens/s over the
baseline's in that same rep; summaries take the median across reps.

Fair to cross-request drafting (a family whose spec is ``cross_request``, e.g. suffix):
each rep's requests name their own draft scope, and the warm-up another, so such a
method's pool holds only what other, earlier prompts of the same rep wrote (and, in a
batch, what batch-mates that finished first wrote) — never an earlier rep's output of the
same prompt, nor the warm-up's. :func:`bench_engine` gives it one pool at a time, and
likewise one scope of prefix cache when the spec asks for one (``prefix_cache``: every
speccore method, ``none`` included, reuses the KV of earlier prompts' shared prefixes, as
vLLM's and SGLang's prefix caches do).

:func:`interleave` is the protocol with its hooks (a callback per measured rep,
resume from stored reps, a failing method dropped while the others go on); the
CLI's ``specops bench`` (:func:`run_bench`) and the benchmark-runner service both
measure through it. The Hugging Face baselines (``hf*``) run ``generate`` on a stock
copy of the model, as its users run it; on CPU speccore's own copy runs the
row-invariant kernels.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from speccore import __version__
from speccore.bandwidth import decode_limit_tokens_per_s, measure_read_bandwidth
from speccore.draft_pool import DraftPools
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.heads.loading import head_for
from speccore.hf_baselines import HF_DEFAULT_K, HF_METHODS, HFGenerator
from speccore.metrics import GenerationMetrics
from speccore.model_cache import release_memory
from speccore.models import LoadedModel, load_model
from speccore.prefix_cache import PrefixCache
from speccore.proposers import NONE, default_k, spec_of
from speccore.proposers.base import KnobValue, ProposerConfig, knob_values
from speccore.sampling import SamplingParams
from speccore.tracing import traced_generate

# The warm-up decodes the first prompt cut to this many tokens.
WARMUP_PROMPT_TOKENS = 64
# Draft scopes of the warm-up and of rep n (REP_SCOPE + n): no rep drafts from another's outputs.
WARMUP_SCOPE = "warm-up"
REP_SCOPE = "rep-"


# --- the protocol -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one generate call of a method returned, per request."""

    token_ids: list[list[int]]  # new tokens of each request; empty lists over HTTP (text, not ids)
    metrics: list[GenerationMetrics]  # of each request; empty where the method reports none (HF)
    overhead_s: float = 0.0  # time of the call spent on anything but decoding (an HTTP engine's scrapes)


# Decodes the requests of one batch (they share sampling parameters).
Method = Callable[[list[Request]], Decoded]


def engine_method(engine: Engine) -> Method:
    def decode(requests: list[Request]) -> Decoded:
        gens = traced_generate(engine, requests)
        return Decoded([g.token_ids for g in gens], [g.metrics for g in gens])

    return decode


def hf_method(hf: HFGenerator) -> Method:
    def decode(requests: list[Request]) -> Decoded:
        outs = [hf.generate(r.prompt_ids, r.max_new_tokens, r.sampling, r.seed or 0) for r in requests]
        return Decoded(outs, [])

    return decode


@dataclass(frozen=True, slots=True)
class Schedule:
    """What every method decodes in every rep."""

    prompts: Sequence[list[int]]  # token ids of each prompt, in prompt-set order
    reps: int
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0  # prompt i decodes with seed + i, in every rep and method
    batch_size: int = 1  # prompts per generate call

    def __post_init__(self) -> None:
        if not self.prompts:
            raise SpecError("no prompts to measure on")
        if self.reps <= 0 or self.batch_size <= 0 or self.max_new_tokens <= 0:
            raise SpecError("reps, batch size and max new tokens must be positive")

    def batches(self, rep: int) -> list[list[Request]]:
        size = self.batch_size
        scope = f"{REP_SCOPE}{rep}"
        return [
            [
                Request(ids, self.max_new_tokens, self.sampling, self.seed + first + i, draft_scope=scope)
                for i, ids in enumerate(self.prompts[first : first + size])
            ]
            for first in range(0, len(self.prompts), size)
        ]

    def warm_up(self) -> list[Request]:
        # A short prompt but every new token: caches and allocator reach the sizes the reps use.
        first = self.prompts[0][:WARMUP_PROMPT_TOKENS]
        return [Request(first, self.max_new_tokens, self.sampling, self.seed, draft_scope=WARMUP_SCOPE)]


@dataclass(frozen=True, slots=True)
class RepRun:
    """One method's share of one rep: what it decoded and how long its generate calls took."""

    method: str
    rep: int
    token_ids: list[list[int]]  # new tokens of each prompt, in prompt-set order
    metrics: list[GenerationMetrics]  # of each prompt; empty where the method reports none (HF)
    seconds: float  # wall time of the method's generate calls in this rep
    speedup: float | None  # tokens/s over the baseline's in this rep; None for the baseline

    @property
    def new_tokens(self) -> int:
        # A method over HTTP gets text, not ids: its metrics count the tokens.
        if self.metrics:
            return sum(m.new_tokens for m in self.metrics)
        return sum(len(ids) for ids in self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


class BaselineFailed(SpecError):
    """The baseline could not decode: no speedup can be measured, so the bench ends."""


def _nothing_stored(method: str, rep: int) -> bool:
    return False


def _quiet(message: str) -> None:
    pass


def interleave(
    schedule: Schedule,
    methods: dict[str, Method],
    on_rep: Callable[[RepRun], None],
    *,
    baseline: str,
    stored: Callable[[str, int], bool] = _nothing_stored,
    log: Callable[[str], None] = _quiet,
) -> dict[str, str]:
    """Warm up every method, then measure every rep; return the dropped methods and why.

    on_rep(run) is called at the end of each rep once per method measured in it, the
    baseline first; an exception it raises stops the bench.

    Resuming: stored(method, rep) says which reps are stored already; they are not
    rerun nor reported. A rep with any method left to measure reruns the baseline as
    well, so every speedup stays a ratio measured in one run; the baseline's run is
    reported again only if it was not stored.

    A method whose decoding raises, or that decodes no tokens in a rep, is dropped
    from `methods` (so its memory can be freed) with its error, and the others go on;
    the baseline failing raises :class:`BaselineFailed`.
    """
    if baseline not in methods:
        raise SpecError(f"the baseline '{baseline}' is not among the methods")
    bench = _Bench(schedule, methods, baseline, log)
    for method in list(methods):
        log(f"warm-up {method}")
        bench.decode(method, schedule.warm_up())
    for rep in range(schedule.reps):
        todo = [m for m in methods if m == baseline or not stored(m, rep)]
        if todo == [baseline] and stored(baseline, rep):
            continue
        for run in bench.rep(rep, todo):
            if not stored(run.method, rep):
                on_rep(run)
    return bench.failures


class _Bench:
    """The methods still in the bench, the ones dropped, and one rep's rotation over them."""

    def __init__(
        self, schedule: Schedule, methods: dict[str, Method], baseline: str, log: Callable[[str], None]
    ) -> None:
        self.schedule = schedule
        self.methods = methods
        self.baseline = baseline
        self.log = log
        self.failures: dict[str, str] = {}

    def decode(self, method: str, requests: list[Request]) -> Decoded | None:
        """One generate call; a method's error drops it, the baseline's ends the bench."""
        try:
            return self.methods[method](requests)
        # Anything a method raises (bad draft, OOM, a bug) costs that method, not the bench.
        except Exception as err:
            if method == self.baseline:
                raise BaselineFailed(f"the baseline failed: {describe(err)}") from err
            self._drop(method, describe(err))
            return None

    def rep(self, rep: int, todo: list[str]) -> list[RepRun]:
        """Decode every batch with each method of `todo` in turn; the runs, the baseline's first."""
        token_ids: dict[str, list[list[int]]] = {m: [] for m in todo}
        metrics: dict[str, list[GenerationMetrics]] = {m: [] for m in todo}
        seconds = dict.fromkeys(todo, 0.0)
        batches = self.schedule.batches(rep)
        for b, requests in enumerate(batches):
            shift = (rep + b) % len(todo)
            for method in todo[shift:] + todo[:shift]:
                if method not in self.methods:
                    continue  # dropped earlier in this rep
                start = time.perf_counter()
                decoded = self.decode(method, requests)
                seconds[method] += time.perf_counter() - start
                if decoded is not None:
                    seconds[method] -= decoded.overhead_s
                    token_ids[method].extend(decoded.token_ids)
                    metrics[method].extend(decoded.metrics)
            self.log(f"rep {rep + 1}/{self.schedule.reps} batch {b + 1}/{len(batches)} done")

        def run(method: str, speedup: float | None) -> RepRun:
            return RepRun(method, rep, token_ids[method], metrics[method], seconds[method], speedup)

        base = run(self.baseline, None)
        if base.tokens_per_s <= 0:
            raise BaselineFailed(f"the baseline generated no tokens in rep {rep}")
        runs = [base]
        for method in todo:
            if method == self.baseline or method not in self.methods:
                continue
            measured = run(method, None)
            if measured.tokens_per_s <= 0:
                self._drop(method, f"generated no tokens in rep {rep}")
                continue
            runs.append(replace(measured, speedup=measured.tokens_per_s / base.tokens_per_s))
        return runs

    def _drop(self, method: str, why: str) -> None:
        del self.methods[method]
        release_memory()
        self.failures[method] = why


def describe(err: BaseException) -> str:
    """An exception on one line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


# --- `specops bench` --------------------------------------------------------------------


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
    prefix_cache: bool = False  # speccore methods reuse the rep's earlier prompts' prefixes

    def __post_init__(self) -> None:
        if "none" not in self.methods:
            self.methods.insert(0, "none")
        if len(set(self.methods)) != len(self.methods):
            raise SpecError("a method is listed twice")
        if self.reps <= 0 or self.n_prompts <= 0 or self.batch_size <= 0:
            raise SpecError("--reps, --n-prompts and --batch-size must be positive")
        for method in self.methods:
            if method not in HF_METHODS:
                family, knobs = method_variant(method)
                if family != NONE:
                    knob_values(family, ProposerConfig(knobs=knobs))  # SpecError before any decoding


class BenchPrompt(Protocol):
    """A prompt to measure on (specprompts.sources.Prompt is one)."""

    id: str
    text: str
    chat: bool  # wrap in the model's chat template


def stock_twin(target: LoadedModel) -> LoadedModel:
    """The target as Hugging Face users run it: on CPU a second copy with the stock
    kernels (speccore's own copy runs row-invariant ones), elsewhere the same model."""
    if target.device.type != "cpu":
        return target
    dtype = str(target.dtype).removeprefix("torch.")
    return load_model(target.ref, device="cpu", dtype=dtype, row_invariant=False)


def build_methods(target: LoadedModel, spec: BenchSpec) -> dict[str, Method]:
    methods: dict[str, Method] = {}
    stock: LoadedModel | None = None
    for method in spec.methods:
        if method in HF_METHODS:
            k = spec.k or HF_DEFAULT_K.get(method, 1)
            stock = stock or stock_twin(target)
            methods[method] = hf_method(HFGenerator(method, stock, k, spec.draft))
            continue
        family, knobs = method_variant(method)
        k = spec.k or default_k(family)
        head = head_for(family, spec.heads, target.ref)
        cfg = ProposerConfig(
            k=k, draft=spec.draft, datastore=spec.datastore, head=head, knobs=knobs, **spec.tree
        )
        methods[method] = engine_method(bench_engine(target, family, cfg, prefix_cache=spec.prefix_cache))
    return methods


def _number(method: str, name: str, text: str) -> KnobValue:
    """A knob's value as written: an int, else a float (every knob is a number)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise SpecError(f"method {method!r}: knob {name} takes a number, got {text!r}")


def method_variant(method: str) -> tuple[str, dict[str, KnobValue]]:
    """A bench method's family and knobs: ``suffix`` is the family at its defaults,
    ``suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2`` the family with those knobs
    (the family's own names; BenchSpec checks them against the family before anything
    decodes), so that one run can measure several settings of a family side by side."""
    family, *settings = method.split(":")
    knobs: dict[str, KnobValue] = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or not name or not value:
            raise SpecError(f"method {method!r}: expected family:knob=value[:knob=value...], got {setting!r}")
        knobs[name] = _number(method, name, value)
    if family == NONE and knobs:
        raise SpecError(f"method {method!r}: plain decoding takes no knobs")
    return family, knobs


def bench_engine(
    target: LoadedModel, method: str, config: ProposerConfig | None = None, *, prefix_cache: bool = False
) -> Engine:
    """The engine that measures ``method``: a cross-request family gets draft pools that keep
    one scope (the rep's), so each rep starts with an empty pool (see the module's docstring);
    with ``prefix_cache``, a prefix cache that keeps one scope alike."""
    cross_request = method != NONE and spec_of(method).cross_request
    return Engine(
        target,
        method,
        config,
        draft_pools=DraftPools(max_scopes=1) if cross_request else None,
        prefix_cache=PrefixCache(max_scopes=1) if prefix_cache else None,
    )


def run_bench(
    target: LoadedModel,
    spec: BenchSpec,
    prompts: Sequence[BenchPrompt],
    log: Callable[[str], None] = print,
) -> dict[str, object]:
    """Measure every method of `spec` on `prompts`.

    A method that fails is left out of ``methods`` and named under ``failures``
    with its error; the others are measured as usual.
    """
    schedule = Schedule(
        prompts=[target.encode_user_prompt(p.text, p.chat) for p in prompts],
        reps=spec.reps,
        max_new_tokens=spec.max_new_tokens,
        sampling=spec.sampling,
        seed=spec.seed,
        batch_size=spec.batch_size,
    )
    runs: dict[str, list[RepRun]] = {m: [] for m in spec.methods}
    methods = build_methods(target, spec)
    failures = interleave(
        schedule, methods, lambda run: runs[run.method].append(run), baseline="none", log=log
    )
    none = runs["none"][0]
    results = {
        method: summarize(measured, none, greedy=spec.sampling.greedy)
        for method, measured in runs.items()
        if method not in failures
    }
    if spec.batch_size == 1:
        _add_free_drafting_limits(results, none.seconds)
    bandwidth = measure_read_bandwidth()
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
        **({"failures": failures} if failures else {}),
    }


def summarize(runs: list[RepRun], none: RepRun, *, greedy: bool) -> dict[str, Any]:
    """One method's results: tokens/s and speedup over the reps, the rest from the first rep."""
    first = runs[0]
    tps = [r.tokens_per_s for r in runs]
    return {
        "tokens_per_s_median": statistics.median(tps),
        "tokens_per_s_reps": tps,
        "speedup_vs_none": statistics.median(1.0 if r.speedup is None else r.speedup for r in runs),
        "new_tokens": first.new_tokens,
        **_acceptance(first.metrics),
        **({"identical_to_baseline": first.token_ids == none.token_ids} if greedy else {}),
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
        "cached_prompt_fraction": sum(m.cached_prompt_tokens for m in ms) / sum(m.prompt_tokens for m in ms),
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
