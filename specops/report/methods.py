"""The report's methods: a label per server, its engine, its flags and its baseline.

speccore's methods are `specops serve engine` flags under a plain label (`none`,
`ngram-k4`, ...). vLLM's are labelled `vllm:<name>` and launched from vLLM's installed CPU
build (specplatform.engines) with the flags `specops apply` renders for the same candidate
(specops_schemas.engine_flags, through the benchmark-runner's `launch_args`), so a vLLM row
measures exactly what a user would deploy. Every method's speed is a ratio against its own
engine's `none` at the same workload and concurrency.
"""

from __future__ import annotations

import shlex

from speccore.errors import SpecError
from specops_schemas.candidates import Candidate
from specops_services.benchmark_runner.engine_server import HttpEngine, launch_args

BASELINE = "none"
VLLM_PREFIX = "vllm:"
# vLLM's methods that its CPU build runs without a trained draft: ngram with speccore's
# lookup window (1..4) and suffix decoding as vLLM drafts it (a path of up to 16 tokens).
VLLM_CANDIDATES = (
    Candidate(candidate_id="ngram-k4", family="ngram", k=4),
    Candidate(candidate_id="suffix-k16", family="suffix", k=16),
)
# Room for 32 concurrent sequences of a few hundred tokens of smollm2 (46 KiB a token in
# float32), which the bench's 512 MiB does not leave.
VLLM_REPORT_ARGS = ("--kv-cache-memory-bytes", str(2 * 1024**3))


def engine_of(label: str) -> HttpEngine:
    return HttpEngine.VLLM if label.startswith(VLLM_PREFIX) else HttpEngine.SPECOPS


def baseline_of(label: str) -> str:
    """The label of the method a method's speed is a ratio against: its engine's `none`."""
    return VLLM_PREFIX + BASELINE if label.startswith(VLLM_PREFIX) else BASELINE


def is_baseline(label: str) -> bool:
    return baseline_of(label) == label


def parse_methods(text: str) -> dict[str, list[str]]:
    """`LABEL=FLAGS;...` of `specops serve engine`; a `none` entry is required."""
    methods: dict[str, list[str]] = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        label, sep, flags = item.partition("=")
        if not sep or not label.strip():
            raise SpecError(f"--methods: {item!r} is not LABEL=FLAGS")
        if label.strip().startswith(VLLM_PREFIX):
            raise SpecError(f"--methods: {label.strip()!r}: vLLM's methods come with --vllm")
        methods[label.strip()] = shlex.split(flags)
    if BASELINE not in methods:
        raise SpecError("--methods needs a `none` entry: speeds are ratios against it")
    return methods


def vllm_methods(server_args: tuple[str, ...]) -> dict[str, list[str]]:
    """vLLM's `none` and VLLM_CANDIDATES, labelled, with apply's flags then `server_args`."""
    engine = HttpEngine.VLLM
    extra = [*_without(server_args, VLLM_REPORT_ARGS[0]), *VLLM_REPORT_ARGS]
    methods = {VLLM_PREFIX + BASELINE: launch_args(engine, None, extra_args=extra)}
    for candidate in VLLM_CANDIDATES:
        methods[VLLM_PREFIX + candidate.candidate_id] = launch_args(engine, candidate, extra_args=extra)
    return methods


def _without(args: tuple[str, ...], flag: str) -> list[str]:
    """`args` less `flag` and its value (the report sets its own)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(f"{flag}="):
            kept.append(arg)
    return kept
