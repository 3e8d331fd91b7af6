"""`specops apply`: a candidate's engine flags and the command that launches the engine with them.

Two forms:

- `specops apply --run RUN_ID [--engine E] [--candidate ID]`: a run's winner (or one of its
  candidates) through the gateway's apply (the SDK's `client.runs.apply`), launched on the
  run's model.
- `specops apply --method M --engine E [--k N] [--draft D] [--tree 4,2,1] [--option K=V] [--model M]`:
  a candidate given on the command line, rendered here without the stack (no gateway, no
  NATS) by the code the gateway's apply runs (specops_schemas.engine_flags), so the flags
  are the same and are checked against the engine's pinned source alike.

`--method` takes our family names and vLLM's (`eagle3`, `mtp`, `draft_model`, ...).

Output: the flags and the launch command, or with `--json` one JSON object: the
ApplyResponse's fields (`run_id` null for a command-line candidate) and `launch`, the launch
command as a list of arguments. `specops run --apply` prints the same.

Exit codes: 0 done; 2 the engine cannot run the candidate, the candidate is invalid, or the
gateway refused or could not be reached (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from pydantic import ValidationError

from speccatalog import families
from speccore.errors import SpecError
from specops.client import SpeculativeClient
from specops.commands import client_command
from specops.commands.decoding import METHOD_ALIASES, resolve_method, shape
from specops_schemas.api import ApplyResponse
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine
from specops_schemas.engine_flags import EngineCannotRun, engine_config

# The launcher before the model, per engine (as the benchmark-runner starts them).
LAUNCHERS: dict[Engine, tuple[str, ...]] = {
    Engine.VLLM: ("vllm", "serve"),
    Engine.SGLANG: ("python", "-m", "sglang.launch_server", "--model-path"),
    Engine.SPECCORE: ("specops", "serve", "engine", "--model"),
}


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    aliases = ", ".join(f"{alias} = {family}" for alias, (family, _) in METHOD_ALIASES.items())
    p = sub.add_parser(
        "apply",
        help="print a candidate's engine flags and launch command (a run's winner, or one given here)",
        description="Print the engine flags of a run's winner (--run, through the gateway) or of a "
        "candidate given on the command line (--method, offline: no stack needed), and the command "
        "that launches the engine with them. --method takes the catalog's families "
        f"({', '.join(families.families())}) and vLLM's names ({aliases}; draft_model and mtp are "
        "both).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="RUN_ID", help="apply this run's winner, through the gateway")
    source.add_argument("--method", help="apply this family (or vLLM's name for it), offline")
    p.add_argument(
        "--engine",
        choices=[e.value for e in Engine],
        help="engine to render for (with --method: required; with --run: default the run's engine)",
    )
    p.add_argument("--model", help="target to launch (default with --run: the run's model; else MODEL)")
    cand = p.add_argument_group("the candidate, with --method")
    cand.add_argument("--k", type=int, help="speculative tokens per step (default: the family's)")
    cand.add_argument("--draft", help="draft model, head or datastore the engine loads (an id or a path)")
    cand.add_argument("--tree", type=shape, help="static tree, children per depth, e.g. 4,2,1")
    cand.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a family option, e.g. prompt_lookup_min=3 for ngram (repeatable)",
    )
    run = p.add_argument_group("the run, with --run")
    run.add_argument("--candidate", help="apply this candidate of the run instead of its winner")
    run.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    run.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token file)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the flags and the launch")
    p.set_defaults(handler=run_apply)


def run_apply(args: argparse.Namespace) -> int:
    """The `specops apply` handler: the exit code; errors are printed as one line."""
    if args.run is not None:
        _refuse(args, ("k", "draft", "tree"), "--method, not --run")
        if args.option:
            raise SpecError("--option goes with --method, not --run")
        return client_command.call("apply", args, _apply_run)
    _refuse(args, ("candidate", "url", "token"), "--run, not --method")
    if args.engine is None:
        raise SpecError(f"--method needs --engine ({', '.join(e.value for e in Engine)})")
    candidate = command_line_candidate(args.method, args.k, args.draft, args.tree, args.option)
    view = offline_apply(candidate, Engine(args.engine), args.model or "MODEL")
    print(json.dumps(view) if args.json else apply_text(view))
    return 0


def _refuse(args: argparse.Namespace, names: tuple[str, ...], goes_with: str) -> None:
    for name in names:
        if getattr(args, name) is not None:
            raise SpecError(f"--{name} goes with {goes_with}")


def _apply_run(client: SpeculativeClient, args: argparse.Namespace) -> int:
    model = args.model or client.runs.get(args.run).request.target.model_ref
    applied = client.runs.apply(args.run, engine=args.engine, candidate_id=args.candidate)
    view = apply_view(applied, model)
    print(json.dumps(view) if args.json else apply_text(view))
    return 0


def command_line_candidate(
    method: str, k: int | None, draft: str | None, tree: tuple[int, ...] | None, options: list[str]
) -> Candidate:
    """The candidate of `--method/--k/--draft/--tree/--option`; SpecError or FamilyError says
    what is wrong with it."""
    family, implied = resolve_method(method)
    if family == "none":
        raise SpecError("plain decoding has no speculative flags: launch the engine without any")
    spec = families.family(family)
    chosen: dict[str, str | int | float | bool] = {**implied, **dict(_option(text) for text in options)}
    spec.knob_values(chosen)  # a misspelt option is refused, not rendered as the default
    k = spec.default_k if k is None else k
    shape_id = "-tree" + "x".join(map(str, tree)) if tree else ""
    try:
        return Candidate(
            candidate_id=f"{family}-k{k}{shape_id}",
            family=family,
            draft=draft,
            k=k,
            tree=list(tree) if tree else None,
            options=chosen,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(f"invalid candidate: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _option(text: str) -> tuple[str, str | int | float | bool]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise SpecError(f"--option takes KEY=VALUE, got {text!r}")
    for number in (int, float):
        try:
            return key, number(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def offline_apply(candidate: Candidate, engine: Engine, model: str) -> dict[str, Any]:
    """What `specops apply --method` prints: the gateway's apply of `candidate`, rendered here."""
    try:
        config, cli_args = engine_config(candidate, engine)
    except EngineCannotRun as exc:
        raise SpecError(str(exc)) from None
    requires = list(families.family(candidate.family).engine_packages.get(engine.value, ()))
    return {
        "run_id": None,
        "candidate_id": candidate.candidate_id,
        "family": candidate.family,
        "config": config.model_dump(mode="json", exclude_none=True),
        "cli_args": cli_args,
        "requires": requires,
        "launch": launch_command(engine, model, cli_args),
    }


def apply_view(applied: ApplyResponse, model: str) -> dict[str, Any]:
    """The gateway's ApplyResponse as `specops apply` prints it: with the launch command."""
    engine = Engine(applied.config.engine)
    return {**applied.model_dump(mode="json"), "launch": launch_command(engine, model, applied.cli_args)}


def launch_command(engine: Engine, model: str, cli_args: list[str]) -> list[str]:
    """The command that starts `engine` serving `model` with the flags."""
    return [*LAUNCHERS[engine], model, *cli_args]


def apply_text(view: dict[str, Any]) -> str:
    """`apply (vllm, ngram-k4): --speculative-config '{...}'`, the packages it needs, and the launch."""
    lines = [f"apply ({view['config']['engine']}, {view['candidate_id']}): {shlex.join(view['cli_args'])}"]
    if view["requires"]:
        lines.append(f"requires: {' '.join(view['requires'])} (install them beside the engine)")
    lines.append(f"launch: {shlex.join(view['launch'])}")
    return "\n".join(lines)
