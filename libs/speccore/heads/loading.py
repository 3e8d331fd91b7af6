"""Opening a trained head for decoding: found, of the method's family, fitting the target."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn
from transformers import PreTrainedModel

import speccatalog.families
from speccore import cpu_kernels
from speccore.errors import SpecError
from speccore.heads.artifact import HeadConfig, check_fits, load_weights, read_config
from speccore.heads.builtin import BUILTIN_HEAD_PREFIX, builtin_head

if TYPE_CHECKING:
    from speccore.models import LoadedModel

M = TypeVar("M", bound=nn.Module)


def output_weight(target: LoadedModel) -> torch.Tensor:
    """[vocab, hidden] the rows of the target's output embedding."""
    head = target.model.get_output_embeddings()
    if head is None:
        raise SpecError(f"target '{target.ref}' has no output embedding for a head to read")
    return head.weight


def head_dir(ref: str, model_ref: str) -> Path:
    """A head directory, or ``builtin:<name>``: a head speccore ships for ``model_ref``."""
    if ref.startswith(BUILTIN_HEAD_PREFIX):
        return builtin_head(model_ref, ref.removeprefix(BUILTIN_HEAD_PREFIX))
    return Path(ref)


def head_for(method: str, heads: tuple[str, ...], model_ref: str) -> str | None:
    """Of several heads (directories or built-in names), the one ``method`` decodes (the
    only one, if just one is given, so that a mismatch is reported by the method itself)."""
    if len(heads) <= 1:
        return heads[0] if heads else None
    families = _decoded_by(method)
    return next((h for h in heads if read_config(head_dir(h, model_ref)).family in families), None)


def open_head(ref: str | None, method: str, target: LoadedModel) -> HeadConfig:
    """The config of head ``ref`` (see head_dir), refused unless ``method`` decodes its
    family and it was trained for the target's hidden size and vocabulary."""
    families = _decoded_by(method)
    if not ref:
        raise SpecError(f"the {method} family needs --head DIR")
    config = read_config(head_dir(ref, target.ref))
    if config.family not in families:
        raise SpecError(
            f"{ref} holds a {config.family} head; method '{method}' decodes {' and '.join(families)} heads"
        )
    vocab, hidden = output_weight(target).shape
    check_fits(config, int(hidden), int(vocab), target.ref)
    return config


def draft_dtype(target: LoadedModel) -> torch.dtype:
    """The dtype a head drafts in: bfloat16 where the target runs float32 on speccore's CPU
    kernels and they run bfloat16 (the native kernels on any x86 host, oneDNN's with AVX-512
    BF16), else the target's.

    Drafting reads the head's weights and the output rows of its draft vocabulary several
    times a step, for a handful of rows: memory-bound matmuls that read half the bytes in
    bfloat16 (packed, 8 rows, on the project's 2-core hosts: 576 x 8192 scoring 1.00 ms in
    float32, 0.36 ms in bfloat16). A draft only proposes and the target verifies in its own
    dtype, so the output does not change; only which tokens are proposed may, where two
    draft scores are within bfloat16's rounding.
    """
    if _on_cpu_kernels(target) and target.dtype == torch.float32 and cpu_kernels.available(torch.bfloat16):
        return torch.bfloat16
    return target.dtype


def load_head(ref: str, module: M, target: LoadedModel) -> M:
    """``module`` with the weights of head ``ref`` (see head_dir), on the target's device,
    in its draft dtype (see draft_dtype)."""
    load_weights(head_dir(ref, target.ref), module)
    ids: torch.Tensor = module.get_buffer("draft_ids")
    vocab = int(output_weight(target).shape[0])
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < vocab:
        raise SpecError(f"{ref}: draft token ids fall outside the target's vocabulary of {vocab}")
    return module.to(target.device, draft_dtype(target)).eval()


def draft_rows(target: LoadedModel, draft_ids: torch.Tensor) -> torch.Tensor:
    """[draft vocab, hidden] the target's output rows of the draft vocabulary, in the draft dtype."""
    return output_weight(target).detach()[draft_ids].to(draft_dtype(target))


def draft_scorer(rows: torch.Tensor, target: LoadedModel) -> nn.Module:
    """A linear layer scoring [..., hidden] states against ``rows`` ([draft vocab, hidden],
    see draft_rows), on the target's kernels."""
    scorer = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device, dtype=rows.dtype)
    scorer.weight = nn.Parameter(rows.detach(), requires_grad=False)
    return cpu_kernels.PackedLinear(scorer) if _on_cpu_kernels(target) else scorer


def on_target_kernels(module: M, target: LoadedModel) -> M:
    """``module``, in place, on the kernels the target runs: where the target is on
    speccore's CPU kernels, its linear layers (of the draft dtype) packed and its decoder
    layers on the row-invariant attention (and so the lean decoder where it applies).

    A draft only proposes, so this is for speed: a packed one-row matmul here takes
    about a third of the time of a stock one.
    """
    if _on_cpu_kernels(target):
        cpu_kernels.pack_linears(module, draft_dtype(target))
        for sub in module.modules():
            if isinstance(sub, PreTrainedModel):
                sub.set_attn_implementation(cpu_kernels.ATTENTION_NAME)
    return module


def _on_cpu_kernels(target: LoadedModel) -> bool:
    return (
        target.device.type == "cpu" and target.model.config._attn_implementation == cpu_kernels.ATTENTION_NAME
    )


def _decoded_by(method: str) -> tuple[str, ...]:
    """The head artifact families a method decodes (its spec's head_artifacts); none for others."""
    spec = speccatalog.families.families().get(method)
    return tuple(spec.head_artifacts) if spec is not None else ()
