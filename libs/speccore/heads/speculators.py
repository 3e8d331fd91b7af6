"""Export an EAGLE-3 head as a speculators checkpoint (``config.json`` +
``model.safetensors``) that vLLM serves as ``Eagle3LlamaForCausalLM``.

Names follow the speculators layout: ``fc`` (the fusion of the tapped target
layers), ``layers.0.*`` (the decoder layer, with ``hidden_norm``), ``norm``,
``lm_head`` over the draft vocabulary, ``d2t`` (draft id -> target id offset) and
``t2d`` (which target ids the draft scores), plus the target's ``embed_tokens``.
vLLM collects an auxiliary hidden state at the *input* of a layer, so our taps at
the outputs of layers l are its layers l + 1.

The config is the schema of the ``speculators`` package's ``Eagle3SpeculatorConfig``
(``src/speculators/config.py`` and ``models/eagle3/config.py`` of speculators 0.9.0,
vllm-project/speculators@c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b; tests load every
export through those classes). vLLM reads from it (``vllm/transformers_utils/configs/
speculators/base.py@052316ae``): ``speculators_config.verifier.name_or_path`` (the
target it loads, so a Hugging Face id, never an offline alias),
``proposal_methods[0].speculative_tokens`` (its default ``num_speculative_tokens``: the
k that was measured) and ``transformer_layer_config`` (the draft layer's config, where
it finds the dtype). SGLang does not load this layout: its EAGLE-3 drafts are
``LlamaForCausalLMEagle3`` checkpoints with their own config.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from speccore.errors import SpecError
from speccore.heads.artifact import WEIGHTS_FILE, read_config
from speccore.heads.eagle import layer_config

# The speculators release whose schema this layout was checked against; an export
# records the installed release instead when there is one (as speculators itself does).
SCHEMA_VERSION = "0.9.0"
SPECULATORS_FILES = ("config.json", "model.safetensors")
EXPORT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def speculators_version() -> str:
    """The speculators release an export claims: the installed one, else SCHEMA_VERSION."""
    try:
        return version("speculators")
    except PackageNotFoundError:
        return SCHEMA_VERSION


def export_for_target(
    head: Path,
    out: Path,
    target: PreTrainedModel,
    verifier: str,
    *,
    speculative_tokens: int,
    dtype: str | None = None,
) -> Path:
    """:func:`export_speculators` with the embeddings and architectures of the loaded ``target``."""
    embeddings = target.get_input_embeddings().weight
    if not isinstance(embeddings, torch.Tensor):
        raise SpecError(f"{type(target).__name__} has no input embedding matrix to export")
    architectures = list(target.config.architectures or [type(target).__name__])
    return export_speculators(
        head,
        out,
        verifier,
        embeddings.detach().to("cpu"),
        architectures,
        speculative_tokens=speculative_tokens,
        dtype=dtype,
    )


def export_speculators(
    head: Path,
    out: Path,
    verifier: str,
    embeddings: torch.Tensor,
    architectures: list[str],
    *,
    speculative_tokens: int,
    dtype: str | None = None,
) -> Path:
    """Write ``head`` (an eagle3 head) to ``out`` for ``verifier``; returns ``out``.

    ``verifier``: the Hugging Face id (or path on the serving host) vLLM loads the target
    by. ``speculative_tokens``: the k to serve, the winner's. ``dtype``: of the floating
    tensors, written into the config; None keeps the head's own.
    """
    if speculative_tokens < 1:
        raise SpecError(f"speculative tokens must be at least 1, got {speculative_tokens}")
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise SpecError(f"unknown dtype '{dtype}'; use one of {', '.join(EXPORT_DTYPES)}")
    config = read_config(head)
    if config.family != "eagle3":
        raise SpecError(f"only EAGLE-3 heads export to the speculators format; {head} is {config.family}")
    if tuple(embeddings.shape) != (config.vocab_size, config.hidden_size):
        raise SpecError(f"the verifier's embeddings {tuple(embeddings.shape)} do not fit the head")
    state = load_file(str(head / WEIGHTS_FILE))
    draft_ids = state["draft_ids"]
    stored = {t.dtype for t in state.values() if t.is_floating_point()}
    if dtype is None and len(stored) != 1:
        raise SpecError(f"the head's weights mix dtypes {sorted(map(str, stored))}; pass a dtype")
    float_dtype = EXPORT_DTYPES[dtype] if dtype is not None else stored.pop()
    dtype_name = str(float_dtype).removeprefix("torch.")
    tensors = {"embed_tokens.weight": embeddings.detach()}
    for name, tensor in state.items():
        if name == "draft_ids" or name == "layer.embed_tokens.weight":
            continue
        if name.startswith("layer.layers.0."):
            tensors["layers.0." + name.removeprefix("layer.layers.0.")] = tensor
        elif name.startswith("fuse."):
            tensors["fc." + name.removeprefix("fuse.")] = tensor
        else:  # norm.weight, lm_head.weight
            tensors[name] = tensor
    tensors["d2t"] = draft_ids - torch.arange(len(draft_ids))
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    tensors = {k: v.to(float_dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    layer = layer_config(config).to_dict()
    layer.update(vocab_size=config.vocab_size, architectures=["LlamaForCausalLM"], model_type="llama")
    # transformers 5 names it dtype, older readers (vLLM on transformers 4) torch_dtype.
    layer.update(dtype=dtype_name, torch_dtype=dtype_name)
    # Older transformers (and vLLM's config readers) look for rope_theta at the top level.
    layer.setdefault("rope_theta", (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    spec = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": speculators_version(),
        "dtype": dtype_name,
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": [layer_id + 1 for layer_id in config.feature_layers],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": architectures},
        },
        "specops_provenance": config.provenance,
    }
    out.mkdir(parents=True, exist_ok=True)
    config_file, weights_file = SPECULATORS_FILES
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / weights_file))
    (out / config_file).write_text(json.dumps(spec, indent=2) + "\n")
    return out
