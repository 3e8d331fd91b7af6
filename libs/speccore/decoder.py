"""A lean forward pass for Llama-family decoders on speccore's CPU kernels.

At batch 1 on a CPU, Hugging Face's module plumbing (module calls, keyword
arguments, per-layer mask and cache dispatch) costs a good part of a decoding step:
about 7 ms of 40 for smollm2-135m on 2 cores. This runs the same arithmetic, op for
op, as one loop over the layers: RMSNorm, the fused q/k/v projection
(``cpu_kernels.PackedGroup``), rotary embeddings from the model's own rotary module,
the cache write, the row-invariant attention, the output projection, RMSNorm and the
fused gate/up projection. Doing the same ops in the same order gives the same bits
as the Hugging Face modules (a test compares them), so either path may serve a model.

Layers that are not plain Llama-style layers (Gemma's extra norms and scaled
embeddings, sliding windows, EAGLE-3's two-part input) keep the Hugging Face path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer, MistralRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

from speccore import cpu_kernels
from speccore.kv_cache import StaticKVCache

# Decoder layers whose forward is exactly: x + attn(norm(x)); x + down(silu(gate) * up)(norm(x)).
LAYERS = (LlamaDecoderLayer, MistralDecoderLayer, Qwen2DecoderLayer)
NORMS = (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm)


@dataclass(slots=True)
class _Layer:
    attn_norm: nn.Module  # RMSNorm (weight, variance_epsilon)
    qkv: cpu_kernels.PackedGroup
    o_proj: cpu_kernels.PackedLinear
    mlp_norm: nn.Module
    gate_up: cpu_kernels.PackedGroup
    down_proj: cpu_kernels.PackedLinear


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """The RMSNorm of the Hugging Face Llama family, op for op."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as Hugging Face applies it: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class LeanDecoder:
    """Runs a supported backbone over a block; see ``build``."""

    def __init__(self, backbone: Any, layers: list[_Layer]) -> None:
        attn = backbone.layers[0].self_attn
        self.backbone = backbone
        self.layers = layers
        self.heads = int(attn.config.num_attention_heads)
        self.kv_heads = int(attn.config.num_key_value_heads)
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)

    @classmethod
    def build(cls, model: nn.Module) -> LeanDecoder | None:
        """A lean decoder for ``model``'s backbone, or None where it does not apply: not
        on the row-invariant CPU kernels, sliding-window attention, or a layer that is
        not a plain Llama-family layer with fused projections."""
        config: Any = getattr(model, "config", None)
        if config is None or config._attn_implementation != cpu_kernels.ATTENTION_NAME:
            return None
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return None
        backbone: Any = getattr(model, "base_model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if backbone is None or not all(hasattr(backbone, name) for name in needed):
            return None
        if type(backbone.embed_tokens) is not nn.Embedding or type(backbone.norm) not in NORMS:
            return None
        layers = [_lean_layer(layer) for layer in backbone.layers]
        if not layers or any(layer is None for layer in layers):
            return None
        return cls(backbone, [layer for layer in layers if layer is not None])

    def forward(
        self,
        cache: StaticKVCache,
        tokens: torch.Tensor | None,  # [batch, q]
        embeds: torch.Tensor | None,  # [batch, q, hidden], instead of tokens
        positions: torch.Tensor,  # [batch, q]
        bias: torch.Tensor,  # cpu_kernels.fold_mask's additive bias
        taps: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states after the final norm [batch, q, hidden], and the outputs of the
        decoder layers in ``taps`` ([batch, q, hidden] each, in the order asked)."""
        x = self.backbone.embed_tokens(tokens) if embeds is None else embeds
        batch, q, hidden = x.shape
        cos, sin = self.backbone.rotary_emb(x, positions)  # [batch, q, head_dim]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        tapped: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            query, key, value = layer.qkv(_rms_norm(layer.attn_norm, x))
            query = _rotate(query.view(batch, q, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            key = _rotate(key.view(batch, q, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            value = value.view(batch, q, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.update(key, value, index)
            attn, _ = cpu_kernels.row_invariant_attention(None, query, keys, values, bias, self.scaling)
            x = x + layer.o_proj(attn.reshape(batch, q, self.heads * self.head_dim))
            gate, up = layer.gate_up(_rms_norm(layer.mlp_norm, x))
            x = x + layer.down_proj(nn.functional.silu(gate) * up)
            if index in taps:
                tapped[index] = x
        return _rms_norm(self.backbone.norm, x), [tapped[i] for i in taps]


def _lean_layer(layer: nn.Module) -> _Layer | None:
    attn: Any = getattr(layer, "self_attn", None)
    mlp: Any = getattr(layer, "mlp", None)
    if type(layer) not in LAYERS or attn is None or mlp is None:
        return None
    qkv = _group_of(attn.q_proj, attn.k_proj, attn.v_proj)
    gate_up = _group_of(mlp.gate_proj, mlp.up_proj)
    norms: tuple[Any, Any] = (layer.input_layernorm, layer.post_attention_layernorm)
    if qkv is None or gate_up is None or any(type(n) not in NORMS for n in norms):
        return None
    if not isinstance(attn.o_proj, cpu_kernels.PackedLinear) or not isinstance(
        mlp.down_proj, cpu_kernels.PackedLinear
    ):
        return None
    if type(mlp.act_fn) not in (SiLUActivation, nn.SiLU):
        return None
    return _Layer(norms[0], qkv, attn.o_proj, norms[1], gate_up, mlp.down_proj)


def _group_of(*parts: nn.Module) -> cpu_kernels.PackedGroup | None:
    """The PackedGroup whose members are ``parts``, in this order, if there is one."""
    if not all(isinstance(p, cpu_kernels.PackedPart) for p in parts):
        return None
    group = parts[0].__dict__["group"]
    same = all(p.__dict__["group"] is group and p.index == i for i, p in enumerate(parts))  # type: ignore[union-attr]
    return group if same and len(group.sizes) == len(parts) else None
