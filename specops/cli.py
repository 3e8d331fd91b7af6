"""The `specops` command line. Contract: see README (other tools parse --json output)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from speccatalog import families
from speccatalog.families.base import DraftSource, FamilyError
from speccatalog.workloads import WORKLOADS
from speccore.errors import SpecError
from specops.commands.decoding import (
    draft_args,
    load_target,
    methods_help,
    model_args,
    positive,
    proposer_config,
    speccore_method,
    speccore_variant,
    tree_knobs,
)
from specops.extras import advice, missing_extra


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=positive, default=128)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specops", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text with a speculative method")
    model_args(gen)
    gen.add_argument("--method", default="none", type=speccore_method, metavar="METHOD", help=methods_help())
    draft_args(gen)
    _sampling_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", type=Path)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, metrics")
    gen.add_argument(
        "--adaptive-k",
        action="store_true",
        help="choose each step's draft size from the measured acceptance and step cost (speccore.adaptive)",
    )

    bench = sub.add_parser("bench", help="interleaved benchmark of methods on a prompt set")
    model_args(bench)
    bench.add_argument(
        "--workload", required=True, choices=WORKLOADS, help="prompt set (with --prompts: the label)"
    )
    bench.add_argument(
        "--prompts", type=Path, help='JSONL of {"prompt", "completion"} lines: their prompts, as chat'
    )
    bench.add_argument(
        "--methods",
        default="none,ngram",
        help="comma-separated; none is always included. A method may set its family's knobs, "
        "e.g. suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2, so that one run measures "
        "several settings of a family. vLLM's names are accepted too (eagle3 = eagle)",
    )
    draft_args(bench)
    _sampling_args(bench)
    bench.add_argument("--n-prompts", type=positive, default=10)
    bench.add_argument("--reps", type=positive, default=3)
    bench.add_argument("--batch-size", type=positive, default=1)
    bench.add_argument(
        "--prefix-cache",
        action="store_true",
        help="every speccore method reuses the KV of earlier prompts' shared prefixes, as vLLM's "
        "and SGLang's prefix caches do (each rep starts empty)",
    )
    bench.add_argument("--out", type=Path, help="where to write the results (default bench/results/...)")
    bench.add_argument("--json", action="store_true", help="also print the results as one JSON object")

    completion = sub.add_parser("completion", help="print the shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))

    # The services' commands live in specops/commands/, one module per area; each
    # parser sets `handler`.
    from specops.commands import (
        apply,
        audit,
        datastores,
        db,
        deploy,
        dlq,
        engines,
        fingerprint,
        heads,
        nats,
        report,
        run,
        runtime,
        serve,
        tokens,
        tune,
    )

    for module in (
        runtime,
        db,
        tokens,
        nats,
        audit,
        dlq,
        serve,
        fingerprint,
        run,
        apply,
        tune,
        heads,
        deploy,
        datastores,
        engines,
        report,
    ):
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        handler = getattr(args, "handler", None) or _COMMANDS[args.command]
        return handler(args)
    except (SpecError, FamilyError) as err:
        print(f"specops: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        extra = missing_extra(err)
        if extra is None:
            raise
        print(f"specops: error: {advice(args.command, extra)} ({err})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specops: interrupted", file=sys.stderr)
        return 130


def _sampling(args: argparse.Namespace):
    from speccore.sampling import SamplingParams

    return SamplingParams.of(args)


def _generate(args: argparse.Namespace) -> int:
    from speccore.detokenize import IncrementalText
    from speccore.engine import Engine, Request

    text = args.prompt if args.prompt is not None else _read_prompt(args.prompt_file)
    if not text.strip():
        raise SpecError("the prompt is empty")
    sampling = _sampling(args)
    cfg = proposer_config(args, args.method, "generate")
    target = load_target(args)
    engine = Engine(target, args.method, cfg, adaptive=args.adaptive_k)
    request = Request(
        target.encode_prompt(text, args.chat), args.max_new_tokens, sampling, args.seed, tuple(args.stop)
    )
    decoder = IncrementalText(target.tokenizer)

    def show(row: int, new: list[int]) -> None:
        sys.stdout.write(decoder.feed(new))
        sys.stdout.flush()

    gen = engine.generate([request], on_tokens=None if args.json else show)[0]
    if args.json:
        out = {
            "text": gen.text,
            "token_ids": gen.token_ids,
            "finish_reason": gen.finish_reason,
            "method": args.method,
            "metrics": gen.metrics.to_dict(),
        }
        print(json.dumps(out))
    else:
        sys.stdout.write(decoder.feed([], final=True))
        m = gen.metrics
        print(
            f"\n[{args.method}] {m.new_tokens} tokens, {m.tokens_per_s:.1f} tok/s, acceptance "
            f"{m.acceptance_rate:.2f}, mean acceptance length {m.mean_acceptance_length:.2f}",
            file=sys.stderr,
        )
    return 0


def _read_prompt(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise SpecError(f"cannot read prompt file {path}: {err.strerror}") from None


def _bench(args: argparse.Namespace) -> int:
    from speccore.bench import BenchSpec, default_output, run_bench
    from specprompts.corpora import builtin_datastore
    from specprompts.sets import file_prompts, load_prompts

    methods = [speccore_variant(m.strip()) for m in args.methods.split(",") if m.strip()]
    spec = BenchSpec(
        workload=args.workload,
        methods=methods,
        n_prompts=args.n_prompts,
        max_new_tokens=args.max_new_tokens,
        reps=args.reps,
        sampling=_sampling(args),
        seed=args.seed,
        batch_size=args.batch_size,
        k=args.k,
        draft=args.draft,
        datastore=args.datastore,
        heads=tuple(args.head),
        prompts=str(args.prompts) if args.prompts else None,
        tree=tree_knobs(args),
        prefix_cache=args.prefix_cache,
    )
    prompts = (
        file_prompts(args.prompts, spec.n_prompts)
        if args.prompts
        else load_prompts(spec.workload, spec.n_prompts, seed=spec.seed)
    )
    target = load_target(args)
    if any(_reads_datastore(method) for method in spec.methods):
        # The workload's built-in datastore (or --datastore builtin:<workload>), built from a
        # corpus that leaves out the measured prompts' conversations.
        built = builtin_datastore(target, spec.datastore, spec.workload, frozenset(p.id for p in prompts))
        if built is not None:
            spec.datastore = str(built)
    result = run_bench(target, spec, prompts, log=lambda msg: print(msg, file=sys.stderr))
    out = args.out or default_output(spec, args.model)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(_table(result), file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    return 0


def _reads_datastore(method: str) -> bool:
    from speccore.bench import method_variant

    spec = families.families().get(method_variant(method)[0])
    return spec is not None and spec.draft_source == DraftSource.DATASTORE


def _table(result: dict) -> str:
    from specops.commands.tables import table

    nan = float("nan")
    rows = []
    for name, r in result["methods"].items():
        accept, mal = r.get("acceptance_rate", nan), r.get("mean_acceptance_length", nan)
        rows.append(
            (
                name,
                f"{r['tokens_per_s_median']:.2f}",
                f"{r['speedup_vs_none']:.2f}x",
                f"{accept:.2f}",
                f"{mal:.2f}",
                str(r.get("identical_to_baseline", "-")),
            )
        )
    header = ("method", "tok/s", "speedup", "accept", "MAL", "identical")
    lines = [table(header, rows, right={"tok/s", "speedup", "accept", "MAL"})]
    lines.extend(f"{name} failed: {why}" for name, why in result.get("failures", {}).items())
    limit = result["plain_decoding_limit"]
    lines.append(
        f"plain-decoding limit: {limit['tokens_per_s']:.1f} tok/s "
        f"({limit['read_bandwidth_gb_s']:.1f} GB/s read bandwidth)"
    )
    return "\n".join(lines)


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def version() -> str:
    """The installed distribution's version; speccore's in a source checkout without one."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("specops")
    except PackageNotFoundError:
        from speccore import __version__

        return __version__


_COMMANDS = {"generate": _generate, "bench": _bench, "completion": _completion}


if __name__ == "__main__":
    sys.exit(main())
