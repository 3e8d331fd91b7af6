"""`specops report`: the serving report (tail latency, throughput, goodput, acceptance per
distribution, $/1M output tokens) measured through `specops serve engine`, one server per method.

Writes `<out>.json` (every number, per-request records included), `<out>.md` and
`<out>-{throughput,p99,speedup}.png`. `make report` runs it at its default size.

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from speccatalog.workloads import WORKLOADS
from speccore.errors import SpecError
from specops.commands import decoding

DEFAULT_OUT = Path("bench/results/serving-report")
DEFAULT_WORKLOADS = "sharegpt,mtbench,humaneval"
DEFAULT_METHODS = "none=--method none;ngram-k4=--method ngram --k 4;eagle=--method eagle --head builtin:eagle"
ADAPTIVE_METHODS = (
    ";ngram-k4-adaptive=--method ngram --k 4 --adaptive-k"
    ";eagle-adaptive=--method eagle --head builtin:eagle --adaptive-k"
)


def _has_adaptive_k() -> bool:
    from specops.commands import serve_engine

    return "adaptive_k" in serve_engine.ENGINE_OPTIONS


def default_methods() -> str:
    """The baseline, n-gram k=4 and the builtin EAGLE head; their adaptive-k variants where the
    server has `--adaptive-k`."""
    return DEFAULT_METHODS + (ADAPTIVE_METHODS if _has_adaptive_k() else "")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="serving report: load at fixed concurrency through the engine server")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument(
        "--methods",
        help="';'-separated LABEL=SERVER FLAGS; must include a `none` label (the baseline). "
        f"Default: {DEFAULT_METHODS} (plus --adaptive-k variants where the server has the flag)",
    )
    p.add_argument(
        "--vllm", action="store_true",
        help="also measure vLLM's CPU build (`specops engines install vllm`): none, ngram k4 and suffix "
        "k16 with the flags `specops apply` renders, each against vLLM's own none",
    )  # fmt: skip
    p.add_argument(
        "--workloads", default=DEFAULT_WORKLOADS,
        help="comma-separated: sharegpt, mtbench, humaneval or a specprompts workload "
        f"({', '.join(WORKLOADS)}) (default {DEFAULT_WORKLOADS})",
    )  # fmt: skip
    positive = decoding.positive
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (default 1,8,32)")
    p.add_argument("--n-prompts", type=positive, default=8, help="distinct prompts per workload (default 8)")
    p.add_argument("--max-tokens", type=positive, default=64, help="max_tokens per request (default 64)")
    p.add_argument(
        "--rounds", type=positive, default=1,
        help="requests per level: at least ROUNDS x the concurrency, prompts cycled (default 1)",
    )  # fmt: skip
    p.add_argument("--reps", type=positive, default=1, help="repetitions of each level, median (default 1)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput SLO: TTFT in s (default 2.0)")
    p.add_argument("--slo-tpot", type=float, default=0.2, help="goodput SLO: TPOT in s (default 0.2)")
    p.add_argument("--threads", type=positive, help="each server's PyTorch threads")
    p.add_argument("--max-batch", type=positive, help="each server's --max-batch (default the server's, 32)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output prefix (default {DEFAULT_OUT})")
    p.add_argument(
        "--render", type=Path, metavar="JSON",
        help="measure nothing: rewrite the markdown and plots of a report's JSON (beside it)",
    )  # fmt: skip
    p.set_defaults(handler=run)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{name}: {text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise SpecError(f"{name}: give positive integers")
    return values


def run(args: argparse.Namespace) -> int:
    from specops.report import stats
    from specops.report.loadgen import __doc__ as loadgen_doc
    from specops.report.methods import parse_methods, vllm_methods
    from specops.report.run import ReportSpec, aggregate, measure
    from specplatform import engines

    if args.render:
        report = json.loads(args.render.read_text())
        report["entries"] = aggregate(report["rows"])
        write(report, args.render.with_name(args.render.name.removesuffix(".json")))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the servers this command started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server_args = ["--device", "cpu", "--dtype", "float32"]
    if args.threads:
        server_args += ["--threads", str(args.threads)]
    if args.max_batch:
        server_args += ["--max-batch", str(args.max_batch)]
    methods = parse_methods(args.methods or default_methods())
    if args.vllm:
        methods |= vllm_methods(engines.VLLM.server_args)
    spec = ReportSpec(
        model=args.model,
        methods=methods,
        workloads=[w.strip() for w in args.workloads.split(",") if w.strip()],
        concurrency=_ints(args.concurrency, "--concurrency"),
        n_prompts=args.n_prompts,
        max_tokens=args.max_tokens,
        reps=args.reps,
        rounds=args.rounds,
        slo=stats.Slo(args.slo_ttft, args.slo_tpot),
        server_args=server_args,
    )
    machine = _machine()
    rows = measure(spec, args.out.parent / f"{args.out.name}-logs")
    entries = aggregate(rows)
    spec_json = {
        "model": spec.model, "methods": spec.methods, "workloads": spec.workloads,
        "concurrency": spec.concurrency, "n_prompts": spec.n_prompts, "max_tokens": spec.max_tokens,
        "reps": spec.reps, "rounds": spec.rounds,
        "slo": {"ttft_s": spec.slo.ttft_s, "tpot_s": spec.slo.tpot_s},
        "server_args": spec.server_args,
    }  # fmt: skip
    report = {
        "command": "specops " + shlex.join(sys.argv[1:]),
        "commit": _commit(),
        "machine": machine,
        "load_after": list(os.getloadavg()),
        "loadgen": " ".join((loadgen_doc or "").split("\n\n")[:2]).replace("\n", " ").strip(),
        "spec": spec_json,
        "entries": entries,
        "rows": rows,
    }
    write(report, args.out)
    return 0


def write(report: dict, out: Path) -> None:
    """`<out>.json`, `<out>.md` and the plots `<out>-*.png`."""
    from specops.report import render

    out.parent.mkdir(parents=True, exist_ok=True)
    report["plots"] = render.plots(report["entries"], report["spec"], out)
    out.with_name(f"{out.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_name(f"{out.name}.md").write_text(render.markdown(report))
    print(f"wrote {out}.json, {out}.md and {len(report['plots'])} plots")


def _machine() -> dict[str, object]:
    import platform
    import time

    return {
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()
