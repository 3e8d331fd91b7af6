"""`specops serve engine`: speccore as an OpenAI-compatible server (specops_services.engine).

The method and its settings are chosen at start, with the options of `specops generate`
(`--method`, `--k`, `--head`, `--draft`, `--datastore`, `--tree-*`), or taken from a T1/T2
run's winner with `--from-run RUN_ID`: the run (from the gateway, through the SDK) must be
completed, for the speccore engine, with a winner measured here; the winner's family, k,
tree shape and knobs are served as measured, its draft (a registry head, ...) where the
gateway's apply says it lies.

Wiring: `serve.add_parsers` adds the options (`add_engine_options`); `serve.run_serve` calls
`run` for the engine and refuses its options for the other services.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speccore.errors import SpecError
from specops.commands import decoding
from specops_schemas.catalog import Engine as EngineName
from specops_schemas.catalog import RunStatus

if TYPE_CHECKING:
    from speccore.models import LoadedModel
    from speccore.proposers import ProposerConfig
    from specops.client import Run
    from specops_schemas.candidates import Candidate

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 32
# dest of every engine-only option: their defaults are all None (or [] for --head), so that
# `specops serve <bus service>` can tell that one was given.
ENGINE_OPTIONS = (
    "model", "device", "dtype", "threads", "method", "k", "draft", "datastore", "head", "tree_shape",
    "tree_topk", "tree_tokens", "max_batch", "host", "port", "served_model_name", "from_run", "url",
    "token", "adaptive_k",
)  # fmt: skip
# The environment switch for --adaptive-k (issue 19's feature flag).
ADAPTIVE_K_ENV = "ENABLE_L4_ADAPTIVE_K"


def add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine options (specops serve engine only)")
    g.add_argument("--model", help="alias, local dir, .gguf file or Hugging Face id (default: the run's)")
    g.add_argument("--device", help="auto, cpu or cuda (default auto)")
    g.add_argument("--dtype", help="auto, float32, bfloat16 or float16 (default auto)")
    g.add_argument("--threads", type=decoding.positive, help="CPU threads for PyTorch")
    g.add_argument("--method", choices=decoding.methods(), help=f"default none; {decoding.methods_help()}")
    decoding.draft_args(g)
    g.add_argument(
        "--max-batch", type=decoding.positive, help=f"rows decoded together (default {DEFAULT_MAX_BATCH})"
    )
    g.add_argument("--host", help=f"address to listen on (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, help=f"port to listen on (default {DEFAULT_PORT})")
    g.add_argument("--served-model-name", help="the model's name in the API (default: --model)")
    g.add_argument("--from-run", metavar="RUN_ID", help="serve this completed T1/T2 run's measured winner")
    g.add_argument("--url", help="--from-run: gateway URL (default: SPECOPS_URL, else `specops up`'s)")
    g.add_argument("--token", help="--from-run: API token (default: SPECOPS_TOKEN, else the state dir's)")
    g.add_argument(
        "--adaptive-k",
        action="store_const",
        const=True,
        help=f"choose each step's draft size from the batch and the measured acceptance ({ADAPTIVE_K_ENV}=1)",
    )


def given_engine_options(args: argparse.Namespace) -> list[str]:
    """The engine-only options given on the command line, as flags."""
    return [f"--{d.replace('_', '-')}" for d in ENGINE_OPTIONS if getattr(args, d, None) not in (None, [])]


@dataclass(frozen=True, slots=True)
class Served:
    """What the server decodes with, chosen before anything starts."""

    method: str
    config: ProposerConfig
    model: str
    origin: str  # where the choice came from, for the log


def choose(args: argparse.Namespace) -> Served:
    """The method, its ProposerConfig and the target: from the flags, or the run's winner."""
    return _from_run(args) if args.from_run else _from_flags(args)


def run(args: argparse.Namespace, served: Served) -> int:
    """Load the target, build the engine and serve until SIGTERM / SIGINT."""
    from speccore.engine import Engine
    from specops_services.engine.app import serve
    from specops_services.engine.serving import ServerOptions

    log.info("serving %s", served.origin)
    load = argparse.Namespace(
        model=served.model, device=args.device or "auto", dtype=args.dtype or "auto", threads=args.threads
    )
    target = decoding.load_target(load)
    engine = Engine(
        target, served.method, _builtin_datastore(target, served.config), adaptive=adaptive_k(args)
    )
    options = ServerOptions(
        served_model_name=args.served_model_name or served.model,
        host=args.host or DEFAULT_HOST,
        port=args.port if args.port is not None else DEFAULT_PORT,
        max_batch=args.max_batch or DEFAULT_MAX_BATCH,
    )
    serve(engine, options)
    return 0


def adaptive_k(args: argparse.Namespace) -> bool:
    """--adaptive-k, or ENABLE_L4_ADAPTIVE_K=1 in the environment."""
    return bool(args.adaptive_k) or os.environ.get(ADAPTIVE_K_ENV, "").strip().lower() in ("1", "true", "yes")


def _from_flags(args: argparse.Namespace) -> Served:
    if not args.model:
        raise SpecError("serve engine needs --model (or --from-run RUN_ID)")
    method = args.method or "none"
    config = decoding.proposer_config(args, method, "serve engine")
    return Served(method, config, args.model, f"{args.model} with {method} (k={config.k})")


def _from_run(args: argparse.Namespace) -> Served:
    """The method, ProposerConfig and target of a run's winner, fetched from the gateway."""
    from speccore.candidates import speccore_candidate
    from specops.client import SpecopsError, SpeculativeClient

    chosen = [f for f in given_engine_options(args) if f in _CHOSEN_BY_RUN]
    if chosen:
        raise SpecError(f"--from-run serves the run's winner as measured; drop {', '.join(chosen)}")
    try:
        with SpeculativeClient(args.url, args.token) as client:
            run = client.runs.get(args.from_run)
            candidate = served_winner(run)
            applied = client.runs.apply(run.id)
    except SpecopsError as exc:
        raise SpecError(f"cannot fetch run {args.from_run}: {exc}") from None
    model = args.model or run.request.target.model_ref
    if model != run.request.target.model_ref:
        raise SpecError(f"run {run.id} measured {run.request.target.model_ref}, not {model}; drop --model")
    spec = speccore_candidate(candidate)
    config = _with_drafts(spec.config, applied.cli_args)
    tree = list(config.tree_shape) if config.tree_shape else "-"
    origin = (
        f"run {run.id}'s winner {candidate.candidate_id} on {model} "
        f"({spec.family}, k={config.k}, tree {tree}, knobs {dict(config.knobs)})"
    )
    return Served(spec.family, config, model, origin)


# What a run's winner decides, so not given beside --from-run.
_CHOSEN_BY_RUN = frozenset(
    {"--method", "--k", "--draft", "--datastore", "--head", "--tree-shape", "--tree-topk", "--tree-tokens"}
)


def served_winner(run: Run) -> Candidate:
    """The candidate `--from-run` serves; SpecError says why the run has none."""
    if run.status != RunStatus.COMPLETED:
        raise SpecError(
            f"run {run.id} is {run.status}, not completed; wait for it (`specops run` follows it)"
        )
    if run.request.target.engine != EngineName.SPECCORE:
        raise SpecError(
            f"run {run.id} chose a winner for {run.request.target.engine}, not speccore; "
            f"apply it to that engine (`POST runs/{run.id}/apply`), or start a speccore run"
        )
    if run.winner is None:
        raise SpecError(f"run {run.id} has no winner: no candidate beat plain decoding; serve --method none")
    if not run.measured or run.winner.measurement is None:
        raise SpecError(f"run {run.id}'s winner was predicted, not measured by speccore; measure it first")
    return run.winner.candidate


def _with_drafts(config: ProposerConfig, cli_args: list[str]) -> ProposerConfig:
    """``config`` with its draft source where the gateway's apply renders it (a registry head's
    directory, ...): the apply's speccore flags are `specops generate`'s, so its parser reads them."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--method")
    decoding.draft_args(parser)
    flags, _ = parser.parse_known_args(cli_args)
    return dataclasses.replace(
        config,
        head=flags.head[0] if flags.head else config.head,
        draft=flags.draft or config.draft,
        datastore=flags.datastore or config.datastore,
    )


def _builtin_datastore(target: LoadedModel, config: ProposerConfig) -> ProposerConfig:
    """A `builtin:<workload>` datastore as its file, built on first use (as `specops bench` does)."""
    from specprompts.corpora import builtin_datastore

    if config.datastore is None:
        return config
    built = builtin_datastore(target, config.datastore, "", frozenset())
    return dataclasses.replace(config, datastore=str(built)) if built is not None else config
