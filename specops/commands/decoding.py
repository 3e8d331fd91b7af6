"""What the commands that decode with speccore share (`specops generate`, `bench`, `serve engine`):
the model and draft options, and from them the loaded target and the proposer's configuration.

torch and speccore's engine load only inside the builders, so that `specops --help` stays quick.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from speccatalog import families
from speccatalog.families.base import FamilyError
from speccore.errors import SpecError

if TYPE_CHECKING:
    from speccore.models import LoadedModel
    from speccore.proposers import ProposerConfig


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def probability_floor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}")
    return value


def shape(value: str) -> tuple[int, ...]:
    try:
        parsed = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated counts like 4,2,1, got {value!r}"
        ) from None
    if min(parsed) <= 0:
        raise argparse.ArgumentTypeError(f"every depth needs at least one child, got {value!r}")
    return parsed


def methods() -> list[str]:
    """speccore's methods: plain decoding, then every family whose spec names a proposer."""
    return ["none", *families.runnable()]


# vLLM's `method` names (its SpeculativeConfig) that are not a family's name: the family, and
# the options that name selects within it. `draft_model`, `ngram`, `medusa`, `suffix`, `eagle`
# and `mtp` are names of both.
METHOD_ALIASES: dict[str, tuple[str, dict[str, int]]] = {"eagle3": ("eagle", {"eagle_version": 3})}


def resolve_method(name: str) -> tuple[str, dict[str, int]]:
    """The family a --method names (vLLM's names accepted) and the options the name implies;
    FamilyError listing the names for an unknown one."""
    family, options = METHOD_ALIASES.get(name, (name, {}))
    if family != "none" and family not in families.families():
        known = ", ".join(["none", *families.families(), *METHOD_ALIASES])
        raise FamilyError(f"unknown method '{name}'; known: {known}")
    return family, dict(options)


def speccore_method(name: str) -> str:
    """A --method speccore decodes with: a runnable family, by our name or vLLM's; an argparse
    error saying why for one speccore cannot run (e.g. mtp, which vLLM and SGLang do)."""
    try:
        family, _ = resolve_method(name)
    except FamilyError:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join([*methods(), *METHOD_ALIASES])})"
        ) from None
    if family in methods():
        return family
    spec = families.family(family)
    engines = [engine for engine in ("vllm", "sglang") if engine in spec.engines]
    where = (
        f"; {' and '.join(engines)} run it: `specops apply --method {name} --engine {engines[0]} "
        "--model M` prints the flags"
        if engines
        else ""
    )
    raise argparse.ArgumentTypeError(f"speccore does not run {name} yet: {spec.summary}{where}")


def speccore_variant(method: str) -> str:
    """A bench method (`family[:knob=value...]`) with its family under our name; SpecError
    saying why for a family speccore cannot run. Other names (bench's own `hf*` baselines, a
    typo) are left to the bench, which knows them."""
    name, colon, knobs = method.partition(":")
    if name not in METHOD_ALIASES and name not in families.families():
        return method
    try:
        return speccore_method(name) + colon + knobs
    except argparse.ArgumentTypeError as exc:
        raise SpecError(str(exc)) from None


def methods_help() -> str:
    runnable = [families.family(name) for name in families.runnable()]
    aliases = ", ".join(f"{alias} = {family}" for alias, (family, _) in METHOD_ALIASES.items())
    return "; ".join(
        [
            "none: plain decoding",
            *(f"{spec.name}: {spec.summary}" for spec in runnable),
            f"vLLM's names are accepted too ({aliases}); mtp and the other families speccore does "
            "not run are refused, naming the engines that do (`specops apply` prints their flags)",
        ]
    )


def model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="alias, local dir, .gguf file or Hugging Face id")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--threads", type=positive, help="CPU threads for PyTorch")


def draft_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--k", type=int, help="draft tokens per step (family default when omitted)")
    p.add_argument(
        "--draft", help="draft model for draft_model/hf_assisted, or self:N (target's first N layers)"
    )
    p.add_argument("--datastore", help="REST datastore built with `specops datastores build`")
    p.add_argument(
        "--head",
        action="append",
        default=[],
        help="trained head for medusa/eagle: a directory (`specops heads train`) or builtin:<name>, "
        "a head shipped for the model; bench: repeatable, each method takes the head it decodes",
    )
    p.add_argument(
        "--tree-shape",
        type=shape,
        help="medusa/eagle static tree, e.g. 4,2,1: 4 children of the pending token, 2 below each, ...",
    )
    # Defaults as in speccore.proposers.base.ProposerConfig (not imported here: it loads torch).
    p.add_argument("--tree-topk", type=positive, help="eagle: children per expanded node (default 2)")
    p.add_argument("--tree-tokens", type=positive, help="medusa/eagle: draft nodes per step (default 5)")
    p.add_argument(
        "--tree-min-prob",
        type=probability_floor,
        help="eagle, dynamic drafting: draft only nodes of at least this probability (default 0: off)",
    )


def tree_knobs(args: argparse.Namespace) -> dict[str, object]:
    """The tree options given on the command line, as ProposerConfig fields."""
    given = {
        "tree_shape": args.tree_shape,
        "tree_topk": args.tree_topk,
        "tree_tokens": args.tree_tokens,
        "tree_min_prob": args.tree_min_prob,
    }
    return {name: value for name, value in given.items() if value is not None}


def single_head(heads: list[str], command: str) -> str | None:
    if len(heads) > 1:
        raise SpecError(f"{command} takes one --head")
    return heads[0] if heads else None


def proposer_config(args: argparse.Namespace, method: str, command: str) -> ProposerConfig:
    """The ProposerConfig of one method from the draft options (`draft_args`)."""
    from speccore.proposers import ProposerConfig, default_k

    return ProposerConfig(
        k=args.k if args.k is not None else default_k(method),
        draft=args.draft,
        datastore=args.datastore,
        head=single_head(args.head, command),
        **tree_knobs(args),  # type: ignore[arg-type]
    )


def load_target(args: argparse.Namespace) -> LoadedModel:
    """The target of the model options (`model_args`), PyTorch on --threads threads if given."""
    import torch

    from speccore.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    return load_model(args.model, device=args.device, dtype=args.dtype)
