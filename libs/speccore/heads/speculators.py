"""Export an EAGLE-3 head as a speculators checkpoint (``config.json`` +
``model.safetensors``) that vLLM serves as ``Eagle3LlamaForCausalLM``.

Names follow the speculators layout: ``fc`` (the fusion of the tapped target
layers), ``layers.0.*`` (the decoder layer, with ``hidden_norm``), ``norm``,
``lm_head`` over the draft vocabulary, ``d2t`` (draft id -> target id offset) and
``t2d`` (which target ids the draft scores), plus the target's ``embed_tokens``.
vLLM collects an auxiliary hidden state at the *input* of a layer, so our taps at
the outputs of layers l are its layers l + 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from speccore.errors import SpecError
from speccore.heads.artifact import WEIGHTS_FILE, read_config
from speccore.heads.eagle import layer_config

SPECULATORS_VERSION = "0.3.0"
DRAFT_TOKENS = 5


def export_speculators(
    head: Path, out: Path, verifier: str, embeddings: torch.Tensor, architectures: list[str]
) -> Path:
    """Write ``head`` (an eagle3 head) to ``out`` for ``verifier``; returns ``out``."""
    config = read_config(head)
    if config.family != "eagle3":
        raise SpecError(f"only EAGLE-3 heads export to the speculators format; {head} is {config.family}")
    if tuple(embeddings.shape) != (config.vocab_size, config.hidden_size):
        raise SpecError(f"the verifier's embeddings {tuple(embeddings.shape)} do not fit the head")
    state = load_file(str(head / WEIGHTS_FILE))
    draft_ids = state["draft_ids"]
    tensors = {"embed_tokens.weight": embeddings.detach().to(torch.float16).contiguous()}
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
    layer = layer_config(config).to_dict()
    layer.update(vocab_size=config.vocab_size, architectures=["LlamaForCausalLM"], model_type="llama")
    # Older transformers (and vLLM's config readers) look for rope_theta at the top level.
    layer.setdefault("rope_theta", (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    spec = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
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
                    "speculative_tokens": DRAFT_TOKENS,
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
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(spec, indent=2) + "\n")
    return out
