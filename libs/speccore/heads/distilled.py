"""A distilled draft model: the target's first N decoder layers, trained to reproduce
the target's last hidden state, with the target's own embeddings and output layer.

It drafts through the ``draft_model`` family like any smaller causal LM
(``--draft DIR``). Only the N layers and the final norm are stored; the embedding
tables come from the target at load time, which is also why the draft always
shares the target's tokenizer.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from speccore import cpu_kernels
from speccore.errors import SpecError
from speccore.heads.artifact import check_fits, load_weights, read_config
from speccore.heads.loading import output_weight
from speccore.models import LoadedModel


class DistilledLayers(nn.Module):
    """The trainable part: N decoder layers and a final norm (their state is the artifact)."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module) -> None:
        super().__init__()
        self.layers = layers
        self.norm = norm


def draft_with(model: PreTrainedModel, part: DistilledLayers) -> PreTrainedModel:
    """``model`` cut to ``part``'s layers and norm; embeddings and head shared with ``model``."""
    n_layers = len(part.layers)
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    source: Any = model.base_model
    backbone = copy.copy(source)
    backbone._modules = dict(source._modules)
    backbone.layers = part.layers
    backbone.norm = part.norm
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    backbone.config = config
    draft._modules[model.base_model_prefix] = backbone
    draft.config = config
    return draft


def initial_layers(model: PreTrainedModel, n_layers: int) -> DistilledLayers:
    """Trainable copies of ``model``'s first ``n_layers`` layers and its final norm."""
    total = int(model.config.get_text_config().num_hidden_layers)
    if not 1 <= n_layers < total:
        raise SpecError(f"a distilled draft needs 1 <= layers < {total} (the target's depth), got {n_layers}")
    source: Any = model.base_model
    part = DistilledLayers(
        nn.ModuleList(copy.deepcopy(layer) for layer in list(source.layers)[:n_layers]),
        copy.deepcopy(source.norm),
    )
    if any(isinstance(m, (cpu_kernels.PackedLinear, cpu_kernels.PackedGroup)) for m in part.modules()):
        raise SpecError(
            "train a distilled draft from a target loaded with stock kernels (row_invariant=False)"
        )
    return part.requires_grad_(True)


def is_distilled(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "head.safetensors").is_file()


def load_distilled(target: LoadedModel, path: Path) -> tuple[PreTrainedModel, int]:
    """The draft model stored in ``path`` for ``target``, and the bytes it adds."""
    config = read_config(path)
    if config.family != "draft":
        raise SpecError(f"{path} holds a {config.family} head, not a distilled draft model")
    text = target.model.config.get_text_config()
    check_fits(config, int(text.hidden_size), int(output_weight(target).shape[0]), target.ref)
    total = int(text.num_hidden_layers)
    if not 1 <= config.num_layers < total:
        raise SpecError(
            f"{path}: a draft of {config.num_layers} layers cannot come from a {total}-layer target"
        )
    source: Any = target.model.base_model
    layer_cls = type(source.layers[0])
    with torch.device("cpu"):
        fresh = nn.ModuleList(layer_cls(text, layer_idx=i) for i in range(config.num_layers))
    part = DistilledLayers(fresh, copy.deepcopy(source.norm))
    load_weights(path, part)
    part.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    if target.device.type == "cpu" and target.model.config._attn_implementation == cpu_kernels.ATTENTION_NAME:
        cpu_kernels.pack_linears(part, target.dtype)
    added = sum(p.numel() * p.element_size() for p in part.parameters())
    return draft_with(target.model, part), added
