"""`specops heads data|train`: training data and learned drafts (Medusa, EAGLE) for a target.

Wiring: `add_parsers(sub)` on the top-level subparsers; each parser sets `handler`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="learned drafts: training data and head training")
    actions = heads.add_subparsers(dest="action", required=True, parser_class=type(heads))

    data = actions.add_parser("data", help="ShareGPT training data for a target, split and self-distilled")
    data.add_argument("--target", required=True, help="model whose chat template (and outputs) to use")
    data.add_argument("--limit", type=int, default=2000, help="ShareGPT exchanges to take")
    data.add_argument("--heldout-fraction", type=float, default=0.05)
    data.add_argument("--self-distill", action="store_true", help="regenerate completions with the target")
    data.add_argument("--max-new-tokens", type=int, default=128, help="reply length when self-distilling")
    data.add_argument("--batch-size", type=int, default=16)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--threads", type=int, help="CPU threads for PyTorch")
    data.add_argument("--out", required=True, type=Path, help="training JSONL")
    data.add_argument("--heldout-out", required=True, type=Path, help="held-out JSONL")
    data.set_defaults(handler=run_data)


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def run_data(args: argparse.Namespace) -> int:
    from speccore.models import load_model
    from speccore.training.prepare import DataPlan, prepare

    _threads(args.threads)
    target = load_model(args.target)
    plan = DataPlan(
        limit=args.limit,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        distill=args.self_distill,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    n_train, n_heldout = prepare(target, plan, args.out, args.heldout_out)
    print(f"wrote {n_train} training examples to {args.out}, {n_heldout} held-out to {args.heldout_out}",
          file=sys.stderr)
    return 0
