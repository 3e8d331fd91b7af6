"""Opening a trained head for decoding: found, of the method's family, fitting the target."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from speccore.errors import SpecError
from speccore.heads.artifact import HeadConfig, check_fits, load_weights, read_config

if TYPE_CHECKING:
    from speccore.models import LoadedModel

M = TypeVar("M", bound=nn.Module)


def output_weight(target: LoadedModel) -> torch.Tensor:
    """[vocab, hidden] the rows of the target's output embedding."""
    head = target.model.get_output_embeddings()
    if head is None:
        raise SpecError(f"target '{target.ref}' has no output embedding for a head to read")
    return head.weight


# The head families each method decodes.
METHOD_FAMILIES: dict[str, tuple[str, ...]] = {"medusa": ("medusa",), "eagle": ("eagle", "eagle3")}


def head_for(method: str, heads: tuple[str, ...]) -> str | None:
    """Of several head directories, the one ``method`` decodes (the only one, if just one
    is given, so that a mismatch is reported by the method itself)."""
    if len(heads) <= 1:
        return heads[0] if heads else None
    families = METHOD_FAMILIES.get(method, ())
    return next((h for h in heads if read_config(Path(h)).family in families), None)


def open_head(ref: str | None, method: str, target: LoadedModel) -> HeadConfig:
    """The config of the head directory ``ref``, refused unless ``method`` decodes its
    family and it was trained for the target's hidden size and vocabulary."""
    families = METHOD_FAMILIES[method]
    if not ref:
        raise SpecError(f"the {method} family needs --head DIR")
    config = read_config(Path(ref))
    if config.family not in families:
        raise SpecError(
            f"{ref} holds a {config.family} head; method '{method}' decodes {' and '.join(families)} heads"
        )
    vocab, hidden = output_weight(target).shape
    check_fits(config, int(hidden), int(vocab), target.ref)
    return config


def load_head(ref: str, module: M, target: LoadedModel) -> M:
    """``module`` with the weights of head directory ``ref``, on the target's device and dtype."""
    load_weights(Path(ref), module)
    ids: torch.Tensor = module.get_buffer("draft_ids")
    vocab = int(output_weight(target).shape[0])
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < vocab:
        raise SpecError(f"{ref}: draft token ids fall outside the target's vocabulary of {vocab}")
    return module.to(target.device, target.dtype).eval()
