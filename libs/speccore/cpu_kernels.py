"""Row-invariant CPU kernels: a token's logits do not depend on how many tokens
share its forward pass.

Speculative decoding verifies a block of q tokens in one pass; plain decoding
feeds one token at a time. With PyTorch's stock CPU kernels the two give
slightly different floats (one-row matmuls take a gemv path, SDPA's flash kernel
blocks its queries), so a near-tie can flip a greedy token. These kernels make
each row's result bit-identical whatever the row count, so a draft chain verified
in one pass gives exactly the logits of plain decoding, and greedy speculative
output equals the target's own greedy output by construction, not by luck. (A
tree node's keys sit at other cache columns than in the chain it stands for, so
its attention sums in another order: equal within rounding, not bit for bit.)

- linear layers use oneDNN with the weight packed once at load time for
  ``ROWS_HINT`` rows; a single row (which oneDNN sends down a gemv path) is padded
  to ``MIN_LINEAR_ROWS``, so every call runs the same blocked kernel. Packing also
  makes a pass over 8-16 rows cost little more than one row (measured on 2 cores,
  smollm2-135m, fp32: one token 40 ms, 8 tokens 46 ms; stock kernels 43 / 86 ms),
  which is what makes verifying a draft nearly free on CPU.
- attention runs as two batched matmuls with the query heads of one key/value
  head folded into rows, padded to at least ``MIN_QUERY_ROWS`` (matmuls of fewer
  rows take other code paths). Keys are read over the cache's block-rounded width
  (``kv_cache.KV_BLOCK``), so masked columns only ever add exact zeros.

On CUDA the stock kernels stay: there losslessness rests on the verifier alone.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "speccore_row_invariant"
ROWS_HINT = 16
MIN_LINEAR_ROWS = 2
MIN_QUERY_ROWS = 8


def available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build runs packed oneDNN matmuls for ``dtype``."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """``nn.Linear`` whose weight lives in oneDNN's blocked layout; inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n < MIN_LINEAR_ROWS:
            rows = torch.cat([rows, rows.new_zeros(MIN_LINEAR_ROWS - n, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out[:n].reshape(*x.shape[:-1], self.out_features)


def row_invariant_attention(
    module: nn.Module,
    query: torch.Tensor,  # [batch, heads, q, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, width, head_dim]
    value: torch.Tensor,  # [batch, kv_heads, width, head_dim]
    attention_mask: torch.Tensor | None,  # [batch | 1, 1, q, width] bool, True = attend; None = causal
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Masked softmax attention whose rows do not depend on the number of queries."""
    batch, heads, q, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    if attention_mask is None:
        cols = torch.arange(width, device=query.device)
        rows = torch.arange(width - q, width, device=query.device)
        attention_mask = (cols[None, :] <= rows[:, None])[None, None]
    mask = attention_mask.expand(batch, 1, q, width)
    # Query head h reads key/value head h // groups: fold each group's heads into rows.
    folded = query.reshape(batch, kv_heads, groups * q, dim)
    fold_mask = mask[:, :, None].expand(batch, 1, groups, q, width).reshape(batch, 1, groups * q, width)
    pad = max(0, MIN_QUERY_ROWS - groups * q)
    if pad:
        folded = torch.cat([folded, folded.new_zeros(batch, kv_heads, pad, dim)], dim=2)
        fold_mask = torch.cat([fold_mask, fold_mask.new_ones(batch, 1, pad, width)], dim=2)
    scores = folded @ key.transpose(-1, -2) * (scaling if scaling is not None else dim**-0.5)
    scores = scores.float().masked_fill(~fold_mask, float("-inf"))
    probs = scores.softmax(-1).to(value.dtype)
    out = (probs @ value)[:, :, : groups * q]  # [batch, kv_heads, groups*q, dim]
    return out.reshape(batch, heads, q, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION_NAME, row_invariant_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def install(model: nn.Module, dtype: torch.dtype) -> bool:
    """Pack the linear layers of a CPU model and switch it to row-invariant attention.

    Returns False (and changes nothing) where oneDNN cannot run ``dtype``. A head
    tied to the input embeddings gets its own packed copy; the embedding table
    stays as it is.
    """
    if not available(dtype):
        return False
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == dtype:
                setattr(parent, name, PackedLinear(child))
    model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
    return True
