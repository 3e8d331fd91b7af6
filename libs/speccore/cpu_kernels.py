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
  ``ROWS_HINT`` rows. Where oneDNN sends a single row down another path (a gemv:
  ``install`` checks each weight shape once on this CPU), a single row is padded
  to ``MIN_LINEAR_ROWS`` so every call runs the same blocked kernel. Packing also
  makes a pass over 8-16 rows cost little more than one row (measured on 2 cores,
  smollm2-135m, fp32: one token 40 ms, 8 tokens 46 ms; stock kernels 43 / 86 ms),
  which is what makes verifying a draft nearly free on CPU.
- attention runs as batched matmuls with the query heads of one key/value head
  folded into rows, padded to at least ``MIN_QUERY_ROWS`` (matmuls of fewer rows
  take other code paths). The value sum runs over fixed chunks of
  ``kv_cache.KV_BLOCK`` key columns, one matmul per chunk, and adds the chunks in
  order: a GEMM picks its reduction blocking from the reduction length, so one
  matmul over the whole width would sum a row differently when a draft block
  makes the cache one chunk wider. Masked columns add exact zeros.
- speccore's runner hands the mask over already folded and padded, as an additive
  float bias (``fold_mask``), once per forward instead of once per layer; a
  boolean mask (Hugging Face's own, e.g. under ``generate``) is folded here.

On CUDA the stock kernels stay: there losslessness rests on the verifier alone.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from speccore.kv_cache import KV_BLOCK

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

    def __init__(self, linear: nn.Linear, min_rows: int = MIN_LINEAR_ROWS) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)
        self.bias = linear.bias
        self.min_rows = min_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n < self.min_rows:
            rows = torch.cat([rows, rows.new_zeros(self.min_rows - n, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out[:n].reshape(*x.shape[:-1], self.out_features)

    @torch.inference_mode()
    def single_row_is_invariant(self) -> bool:
        """Whether one row alone gets the bits it gets inside blocks of 2 to 3 * ROWS_HINT rows."""
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(3 * ROWS_HINT, self.in_features, generator=gen).to(self.packed.dtype)
        alone = torch.ops.mkldnn._linear_pointwise(x[:1], self.packed, self.bias, "none", [], "")
        return all(
            torch.equal(
                torch.ops.mkldnn._linear_pointwise(x[:n], self.packed, self.bias, "none", [], "")[:1], alone
            )
            for n in (2, 3, ROWS_HINT // 2, ROWS_HINT, ROWS_HINT + 1, 3 * ROWS_HINT)
        )


def fold_mask(mask: torch.Tensor, groups: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[batch, 1, q, width] bool (True = attend) -> [batch, 1, rows, width] additive bias.

    Row g * q + i of the result is query i of the g-th head sharing a key/value
    head; rows past groups * q are padding (``MIN_QUERY_ROWS``) and attend to all.
    """
    batch, _, q, width = mask.shape
    folded = mask[:, :, None].expand(batch, 1, groups, q, width).reshape(batch, 1, groups * q, width)
    bias = torch.zeros(batch, 1, max(MIN_QUERY_ROWS, groups * q), width, dtype=dtype, device=mask.device)
    bias[:, :, : groups * q].masked_fill_(~folded, float("-inf"))
    return bias


def row_invariant_attention(
    module: nn.Module,
    query: torch.Tensor,  # [batch, heads, q, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, width, head_dim]
    value: torch.Tensor,  # [batch, kv_heads, width, head_dim]
    # [batch | 1, 1, q, width] bool, True = attend; or fold_mask's float bias; None = causal
    attention_mask: torch.Tensor | None,
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
    bias = attention_mask
    if bias.dtype == torch.bool:
        bias = fold_mask(bias.expand(batch, 1, q, width), groups)
    # Query head h reads key/value head h // groups: fold each group's heads into rows.
    folded = query.reshape(batch, kv_heads, groups * q, dim)
    n_rows = bias.shape[2]
    if n_rows > groups * q:
        folded = torch.cat([folded, folded.new_zeros(batch, kv_heads, n_rows - groups * q, dim)], dim=2)
    scores = folded @ key.transpose(-1, -2) * (scaling if scaling is not None else dim**-0.5)
    probs = (scores.float() + bias).softmax(-1).to(value.dtype)  # [batch, kv_heads, rows, width]
    if width % KV_BLOCK == 0:
        chunks = width // KV_BLOCK
        parts = probs.view(batch, kv_heads, n_rows, chunks, KV_BLOCK).transpose(2, 3) @ value.view(
            batch, kv_heads, chunks, KV_BLOCK, dim
        )  # [batch, kv_heads, chunks, rows, dim]
        out = parts.cumsum(2)[:, :, -1]  # a sequential sum: trailing zero chunks change no bit
    else:  # not speccore's cache (Hugging Face's own under generate): no invariance promised
        out = probs @ value
    out = out[:, :, : groups * q]  # [batch, kv_heads, groups*q, dim]
    return out.reshape(batch, heads, q, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION_NAME, row_invariant_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def install(model: nn.Module, dtype: torch.dtype) -> bool:
    """Pack the linear layers of a CPU model and switch it to row-invariant attention.

    Returns False (and changes nothing) where oneDNN cannot run ``dtype``. A head
    tied to the input embeddings gets its own packed copy; the embedding table
    stays as it is. The output embedding keeps its plain ``weight`` beside the packed
    copy (the same tensor as the embedding table when tied).
    """
    if not available(dtype):
        return False
    pack_linears(model, dtype, model.get_output_embeddings() if isinstance(model, PreTrainedModel) else None)
    model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
    return True


def pack_linears(module: nn.Module, dtype: torch.dtype, output: nn.Module | None = None) -> None:
    """Replace every ``nn.Linear`` of ``dtype`` under ``module`` by a PackedLinear.

    Single rows go unpadded for the weight shapes where this CPU's oneDNN gives them
    the bits of a block anyway (checked once per shape). ``output`` (the output
    embedding) keeps its plain weight.
    """
    min_rows: dict[tuple[int, int, bool], int] = {}
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == dtype:
                packed = PackedLinear(child)
                shape = (child.in_features, child.out_features, child.bias is not None)
                if shape not in min_rows:
                    min_rows[shape] = 1 if packed.single_row_is_invariant() else MIN_LINEAR_ROWS
                packed.min_rows = min_rows[shape]
                if child is output:
                    # Learned drafts score tokens with the output embedding's rows.
                    packed.weight = child.weight
                setattr(parent, name, packed)
