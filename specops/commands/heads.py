"""`specops heads data|train|export`: training data and learned drafts (Medusa, EAGLE) for a
target, on this machine; `specops heads upload|submit|list|show|transition`: the same as a
service, through the gateway's head registry (the SDK's `client.heads`).

Wiring: `add_parsers(sub)` on the top-level subparsers; each parser sets `handler`.
Exit codes of the registry commands: 0 done; 2 the gateway refused or could not be reached
(one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speccore.split import HELDOUT_FRACTION


def add_parsers(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="learned drafts: training data and head training")
    actions = heads.add_subparsers(dest="action", required=True, parser_class=type(heads))

    data = actions.add_parser("data", help="ShareGPT training data for a target, split and self-distilled")
    data.add_argument("--target", required=True, help="model whose chat template (and outputs) to use")
    data.add_argument("--limit", type=int, default=2000, help="ShareGPT exchanges to take")
    data.add_argument("--heldout-fraction", type=float, default=HELDOUT_FRACTION)
    data.add_argument("--self-distill", action="store_true", help="regenerate completions with the target")
    data.add_argument("--max-new-tokens", type=int, default=128, help="reply length when self-distilling")
    data.add_argument("--batch-size", type=int, default=16)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--threads", type=int, help="CPU threads for PyTorch")
    data.add_argument("--device", help="where the target decodes (default auto: cuda if any)")
    data.add_argument("--out", type=Path, help="training JSONL")
    data.add_argument("--heldout-out", type=Path, help="held-out JSONL")
    data.add_argument(
        "--chunks-dir",
        type=Path,
        help="instead of --out/--heldout-out: a resumable directory of chunk files and a manifest "
        "(a rerun writes only the files it lacks; see speccore.training.chunks)",
    )
    data.add_argument("--chunk-examples", type=int, default=1000, help="training examples per chunk file")
    data.set_defaults(handler=run_data)

    tr = actions.add_parser("train", help="train a Medusa or EAGLE head, or a distilled draft model")
    tr.add_argument("--target", required=True, help="alias, local dir, .gguf file or Hugging Face id")
    tr.add_argument("--family", required=True, choices=("medusa", "eagle", "eagle3", "draft"))
    tr.add_argument(
        "--data",
        required=True,
        type=Path,
        help='JSONL of {"prompt", "completion"} lines, or a chunk directory (`heads data --chunks-dir`)',
    )
    tr.add_argument(
        "--heldout",
        type=Path,
        help="held-out JSONL (default: a chunk directory's heldout.jsonl, else 5%% of --data by prompt hash)",
    )
    tr.add_argument("--epochs", type=int, default=2)
    tr.add_argument("--budget-minutes", type=float, help="stop with a checkpoint after this much training")
    tr.add_argument("--lr", type=float, help="peak learning rate (default: the family's)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head scores")
    tr.add_argument("--num-heads", type=int, default=4, help="medusa heads")
    tr.add_argument("--draft-layers", type=int, default=6, help="draft: the target's first N layers")
    tr.add_argument(
        "--ttt-steps",
        type=int,
        help="EAGLE training-time test: unroll the head on its own outputs this deep (eagle 1, eagle3 3)",
    )
    tr.add_argument("--max-len", type=int, default=512, help="tokens per training sequence")
    tr.add_argument("--batch-tokens", type=int, default=4096, help="tokens per training batch")
    tr.add_argument("--checkpoint-every", type=int, default=25, help="steps between checkpoints")
    tr.add_argument(
        "--init-from",
        type=Path,
        help="a head directory to continue training from (same family and draft vocabulary); "
        "the learning-rate schedule starts afresh",
    )
    tr.add_argument("--device", default="auto", help="auto, cpu or cuda")
    tr.add_argument("--threads", type=int, help="CPU threads for PyTorch")
    tr.add_argument("--quiet", action="store_true", help="no progress bars")
    tr.add_argument("--out", required=True, type=Path, help="directory for the head (and its checkpoint)")
    tr.set_defaults(handler=run_train)

    ex = actions.add_parser("export", help="write an EAGLE-3 head as a speculators checkpoint for vLLM")
    ex.add_argument("--head", required=True, type=Path, help="directory written by `heads train`")
    ex.add_argument("--target", required=True, help="the verifier (its embeddings go into the checkpoint)")
    ex.add_argument(
        "--verifier-name",
        help="Hugging Face id (or path on the serving host) vLLM loads the verifier by "
        "(default: --target's hub id; an offline alias maps to the repo it quantizes)",
    )
    k = ex.add_mutually_exclusive_group(required=True)
    k.add_argument("--k", type=int, help="speculative tokens vLLM drafts per step (the measured winner's k)")
    k.add_argument("--from-run", metavar="RUN_ID", help="take k from this T1 run's winner (asks the gateway)")
    dtypes = ("float16", "bfloat16", "float32")
    ex.add_argument("--dtype", choices=dtypes, help="the weights' dtype (default: the head's)")
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--url", help="gateway URL for --from-run (default: SPECOPS_URL, else `specops up`'s)")
    ex.add_argument("--token", help="API token for --from-run (default: SPECOPS_TOKEN, else the state dir's)")
    ex.set_defaults(handler=run_export)

    _registry_parsers(actions)


def _registry_parsers(actions: argparse._SubParsersAction) -> None:
    up = actions.add_parser(
        "upload", help="upload a training or held-out JSONL to the gateway; prints its sha256"
    )
    up.add_argument("file", type=Path, help='JSONL of {"prompt", "completion"} lines')
    up.set_defaults(handler=run_upload)

    sb = actions.add_parser(
        "submit", help="train a head as a service (the gateway's head registry); prints its id"
    )
    sb.add_argument("--target", required=True, help="alias, local dir or HF id of the target")
    sb.add_argument("--family", required=True, choices=("medusa", "eagle", "eagle3"))
    sb.add_argument("--train-data", required=True, help="sha256 of an upload (`specops heads upload`)")
    sb.add_argument("--heldout-data", help="sha256 of the held-out upload (default: 5%% of the training set)")
    sb.add_argument("--name", help="a name for the head")
    sb.add_argument("--epochs", type=int)
    sb.add_argument("--budget-minutes", type=float)
    sb.add_argument("--lr", type=float)
    sb.add_argument("--seed", type=int)
    sb.add_argument("--num-heads", type=int)
    sb.add_argument("--draft-vocab", type=int)
    sb.add_argument("--max-len", type=int)
    sb.add_argument("--min-acceptance", type=float, help="the gate's least acceptance rate")
    sb.add_argument("--min-speedup", type=float, help="the gate's least speedup over none")
    sb.set_defaults(handler=run_submit)

    ls = actions.add_parser("list", help="the tenant's heads in the registry, newest first")
    ls.set_defaults(handler=run_list)

    sh = actions.add_parser("show", help="one head of the registry: state, curve, gate, transitions")
    sh.add_argument("head_id")
    sh.set_defaults(handler=run_show)

    tr = actions.add_parser("transition", help="move a head to uat, production or deprecated")
    tr.add_argument("head_id")
    tr.add_argument("--to", required=True, choices=("uat", "production", "deprecated"))
    tr.add_argument("--rationale", help="why (required for production and deprecated)")
    tr.set_defaults(handler=run_transition)

    for action in (up, sb, ls, sh, tr):
        action.add_argument(
            "--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)"
        )
        action.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token)")
        action.add_argument("--json", action="store_true", help="print JSON")


def _registry(name: str, args: argparse.Namespace, work: Callable[[Any, argparse.Namespace], int]) -> int:
    from specops.commands.client_command import call

    return call(f"heads {name}", args, work)


def run_upload(args: argparse.Namespace) -> int:
    def work(client: Any, a: argparse.Namespace) -> int:
        try:
            data = client.heads.upload(a.file)
        except OSError as exc:
            from specops.commands.client_command import error

            return error("heads upload", str(exc))
        print(data.model_dump_json() if a.json else data.sha256)
        return 0

    return _registry("upload", args, work)


def run_submit(args: argparse.Namespace) -> int:
    def work(client: Any, a: argparse.Namespace) -> int:
        fields = {
            "target": a.target,
            "family": a.family,
            "train_data": a.train_data,
            "heldout_data": a.heldout_data,
            "name": a.name,
            "epochs": a.epochs,
            "budget_minutes": a.budget_minutes,
            "lr": a.lr,
            "seed": a.seed,
            "num_heads": a.num_heads,
            "draft_vocab": a.draft_vocab,
            "max_len": a.max_len,
        }
        gate = {"min_acceptance": a.min_acceptance, "min_speedup": a.min_speedup}
        gate = {k: v for k, v in gate.items() if v is not None}
        if gate:
            fields["gate"] = gate
        head = client.heads.submit(**{k: v for k, v in fields.items() if v is not None})
        print(head.model_dump_json() if a.json else head.id)
        return 0

    return _registry("submit", args, work)


def run_list(args: argparse.Namespace) -> int:
    def work(client: Any, a: argparse.Namespace) -> int:
        heads = client.heads.list()
        if a.json:
            from specops_schemas.heads import HeadList

            print(HeadList(heads=heads).model_dump_json())
            return 0
        from specops.commands.tables import table

        rows = [(h.id, str(h.state), str(h.family), h.target, h.name or "") for h in heads]
        print(table(("id", "state", "family", "target", "name"), rows))
        return 0

    return _registry("list", args, work)


def run_show(args: argparse.Namespace) -> int:
    def work(client: Any, a: argparse.Namespace) -> int:
        head = client.heads.get(a.head_id)
        print(head.model_dump_json(indent=None if a.json else 2))
        return 0

    return _registry("show", args, work)


def run_transition(args: argparse.Namespace) -> int:
    def work(client: Any, a: argparse.Namespace) -> int:
        head = client.heads.transition(a.head_id, a.to, a.rationale)
        print(head.model_dump_json() if a.json else f"{head.id} {head.state}")
        return 0

    return _registry("transition", args, work)


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def run_data(args: argparse.Namespace) -> int:
    from speccore.errors import SpecError
    from speccore.models import load_model
    from speccore.training.prepare import DataPlan, prepare, prepare_chunks
    from specprompts.examples import sharegpt_examples

    if (args.chunks_dir is None) == (args.out is None or args.heldout_out is None):
        raise SpecError("give either --out and --heldout-out, or --chunks-dir")
    _threads(args.threads)
    target = load_model(args.target, device=args.device or "auto")
    plan = DataPlan(
        limit=args.limit,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        distill=args.self_distill,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    if args.chunks_dir is not None:
        store = prepare_chunks(target, plan, sharegpt_examples, args.chunks_dir, args.chunk_examples)
        files = store.files.values()
        print(
            f"{args.chunks_dir}: {len(files)} files, {sum(f.examples for f in files)} examples, "
            f"{sum(f.reply_tokens for f in files)} reply tokens",
            file=sys.stderr,
        )
        return 0
    n_train, n_heldout = prepare(target, plan, sharegpt_examples, args.out, args.heldout_out)
    print(
        f"wrote {n_train} training examples to {args.out}, {n_heldout} held-out to {args.heldout_out}",
        file=sys.stderr,
    )
    return 0


def run_train(args: argparse.Namespace) -> int:
    import json

    from speccore.models import load_model
    from speccore.training.run import HeadPlan, train_head
    from speccore.training.trainer import EpochReport

    _threads(args.threads)
    plan = HeadPlan(  # checks the family and its flag before the model loads
        family=args.family,
        epochs=args.epochs,
        lr=args.lr,
        seed=args.seed,
        budget_minutes=args.budget_minutes,
        max_len=args.max_len,
        batch_tokens=args.batch_tokens,
        draft_vocab=args.draft_vocab,
        num_heads=args.num_heads,
        draft_layers=args.draft_layers,
        ttt_steps=args.ttt_steps,
        checkpoint_every=args.checkpoint_every,
        init_from=str(args.init_from) if args.init_from else None,
        extra={"command": " ".join(["specops", *sys.argv[1:]])},
    )
    # A distilled draft trains copies of the target's layers: they need the stock kernels.
    target = load_model(args.target, device=args.device, row_invariant=args.family != "draft")

    def report(r: EpochReport) -> None:
        measured = ", ".join(f"{k} {v:.3f}" for k, v in r.heldout.items())
        loss = "untrained" if r.train_loss is None else f"loss {r.train_loss:.4f}"
        print(f"epoch {r.epoch}: {loss}, {r.tokens_seen} tokens; held-out: {measured}", file=sys.stderr)

    result = train_head(target, plan, args.data, args.heldout, args.out, report, progress=not args.quiet)
    summary = {
        "out": str(args.out),
        "steps": result.steps,
        "stopped_by": result.stopped_by,
        "resumed_from_step": result.resumed_from_step,
        "heldout": result.reports[-1].heldout if result.reports else {},
    }
    print(json.dumps(summary))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from specops.commands.client_command import error

    k = args.k if args.from_run is None else _winner_k(args)
    if k is None:
        return 2
    if k < 1:
        return error("heads export", f"--k must be at least 1, got {k}")

    import torch

    from speccore.errors import SpecError
    from speccore.heads.speculators import export_speculators
    from speccore.models import hub_id, load_model

    verifier = args.verifier_name or hub_id(args.target)
    if verifier is None:
        return error(
            "heads export",
            f"vLLM cannot load '{args.target}' from this host's files; pass --verifier-name "
            "(the target's Hugging Face id, or its path on the serving host)",
        )
    target = load_model(args.target, device="cpu")
    embeddings = target.model.get_input_embeddings().weight
    assert isinstance(embeddings, torch.Tensor)
    architectures = list(target.model.config.architectures or [type(target.model).__name__])
    try:
        out = export_speculators(
            args.head, args.out, verifier, embeddings, architectures, speculative_tokens=k, dtype=args.dtype
        )
    except SpecError as exc:
        return error("heads export", str(exc))
    print(f"wrote a speculators EAGLE-3 checkpoint (k={k}, verifier {verifier}) to {out}", file=sys.stderr)
    return 0


def _winner_k(args: argparse.Namespace) -> int | None:
    """The k of run ``--from-run``'s winner; None (after saying why) when there is none."""
    from specops.commands.client_command import call

    found: list[int] = []

    def work(client: Any, a: argparse.Namespace) -> int:
        from specops.commands.client_command import error

        run = client.runs.get(a.from_run)
        if run.winner is None:
            return error("heads export", f"run {a.from_run} has no winner (yet); pass --k")
        winner = run.winner.candidate
        if winner.family != "eagle":
            why = f"run {a.from_run}'s winner is {winner.family}, not an EAGLE head; pass --k"
            return error("heads export", why)
        found.append(winner.k)
        return 0

    call("heads export", args, work)
    return found[0] if found else None
