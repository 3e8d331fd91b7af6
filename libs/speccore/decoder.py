"""A lean forward pass for Llama-family decoders on speccore's native CPU kernels.

At batch 1 on a CPU, a decoding step of a small model is dominated by everything but its
weights: Hugging Face's module plumbing (module calls, keyword arguments, per-layer mask
and cache dispatch) and the few dozen torch ops a layer runs, a few microseconds each.
This runs the same arithmetic in one native call a forward pass (``speccore.native_kernels``'
``decoder_forward``: all layers in one parallel region, its threads splitting each step; per
layer the fused q/k/v projection (``cpu_kernels.PackedGroup``); rotary embedding and the
cache write; masked attention; the output projection; the residual add fused with the next
RMSNorm; the fused gate/up projection; the SiLU-gated product; the down projection; the
residual add fused with the next layer's RMSNorm). Every kernel computes each row on its own
in one fixed order, so a block's rows get the bits of decoding its tokens one at a time. The
results equal the Hugging Face modules' within float rounding (sums run in another order; a
test compares them); a model runs one path or the other throughout.

Layers that are not plain Llama-style layers (Gemma's extra norms and scaled embeddings,
sliding windows, EAGLE-3's two-part input), and hosts where the native kernels do not
build, keep the Hugging Face path.
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

from speccore import cpu_kernels, native_kernels
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

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(m.out_features for m in (self.qkv, self.o_proj, self.gate_up, self.down_proj))


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
        self.native: Any = native_kernels.load()
        # What the native forward takes besides the block, flattened over the layers: four
        # packed weights and biases each (q/k/v, o, gate/up, down), their output sizes (one
        # layer's: the same in every layer), and the norms in the order they run (each
        # layer's input and post-attention norm, then the final norm) with their epsilons.
        matmuls = [m for layer in layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)]
        self.packed = [m.packed for m in matmuls]
        self.biases = [m.bias for m in matmuls]
        self.out_features = list(layers[0].shape)
        norms = [n for layer in layers for n in (layer.attn_norm, layer.mlp_norm)] + [backbone.norm]
        self.norms = [n.weight for n in norms]
        self.eps = [float(n.variance_epsilon) for n in norms]

    @classmethod
    def build(cls, model: nn.Module) -> LeanDecoder | None:
        """A lean decoder for ``model``'s backbone, or None where it does not apply: not
        on the row-invariant CPU kernels, no native kernels on this host, sliding-window
        attention, or a layer that is not a plain Llama-family layer with fused projections,
        or layers of different shapes."""
        config: Any = getattr(model, "config", None)
        if config is None or config._attn_implementation != cpu_kernels.ATTENTION_NAME:
            return None
        if native_kernels.load() is None:
            return None
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return None
        backbone: Any = getattr(model, "base_model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if backbone is None or not all(hasattr(backbone, name) for name in needed):
            return None
        if type(backbone.embed_tokens) is not nn.Embedding or type(backbone.norm) not in NORMS:
            return None
        found = [_lean_layer(layer) for layer in backbone.layers]
        layers = [layer for layer in found if layer is not None]
        if not layers or len(layers) != len(found):
            return None
        if len({layer.shape for layer in layers}) != 1:
            return None  # the native forward takes layers of one shape
        return cls(backbone, layers)

    def forward(
        self,
        cache: StaticKVCache,
        tokens: torch.Tensor | None,  # [batch, q]
        embeds: torch.Tensor | None,  # [batch, q, hidden], instead of tokens
        positions: torch.Tensor,  # [batch, q]
        mask: torch.Tensor,  # [batch, q, width] bool, True = attend
        taps: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states after the final norm [batch, q, hidden], and the outputs of the
        decoder layers in ``taps`` ([batch, q, hidden] each, in the order asked)."""
        x = self.backbone.embed_tokens(tokens) if embeds is None else embeds
        batch, q, hidden = x.shape
        # [batch, q, head_dim] each
        cos, sin = (part.contiguous() for part in self.backbone.rotary_emb(x, positions))
        x = x.reshape(batch * q, hidden).clone()  # the residual stream, added to in place
        buffers = [cache.buffers(i, self.kv_heads, self.head_dim) for i in range(len(self.layers))]
        normed, *tapped = self.native.decoder_forward(
            x, self.packed, self.out_features, self.biases, self.norms, self.eps, cos, sin,
            [k for k, _ in buffers], [v for _, v in buffers],
            cache.lengths.to(x.device), mask.contiguous(), self.heads, self.kv_heads, self.scaling,
            list(taps), cpu_kernels.matmul_threads() or torch.get_num_threads(),
        )  # fmt: skip
        return normed.view(batch, q, hidden), [t.view(batch, q, hidden) for t in tapped]


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
    if any(m.packed.dim() != 4 for m in (qkv, attn.o_proj, gate_up, mlp.down_proj)):
        return None  # a weight the native kernels do not take (oneDNN's layout)
    return _Layer(norms[0], qkv, attn.o_proj, norms[1], gate_up, mlp.down_proj)


def _group_of(*parts: nn.Module) -> cpu_kernels.PackedGroup | None:
    """The PackedGroup whose members are ``parts``, in this order, if there is one."""
    if not all(isinstance(p, cpu_kernels.PackedPart) for p in parts):
        return None
    group = parts[0].__dict__["group"]
    same = all(p.__dict__["group"] is group and p.index == i for i, p in enumerate(parts))  # type: ignore[union-attr]
    return group if same and len(group.sizes) == len(parts) else None
