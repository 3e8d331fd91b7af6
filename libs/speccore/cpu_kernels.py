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

- linear layers multiply by a weight packed once at load time. Where speccore's native
  kernels build (``native_kernels``: every output summed in one fixed order, any row
  count; float32 or bfloat16 weights streamed at close to the read bandwidth), they run
  them. Elsewhere oneDNN runs them, packed for ``ROWS_HINT`` rows, a block of fewer than
  ``MIN_LINEAR_ROWS`` rows padded to that many: oneDNN sends one or two rows down other
  paths (gemv-like kernels that sum in another order). Either way a pass over a few rows
  costs about what one row costs (the weights are read once), which is what makes
  verifying a draft nearly free on CPU.
- sibling projections that read the same input (``FUSED_GROUPS``: q/k/v, gate/up)
  are packed as one matmul (``PackedGroup``); each output column is the same dot
  product as before, so the fused result has the separate layers' bits (a test
  checks). Hugging Face's modules still call them one by one (``PackedPart``) and
  get slices of one computation.
- attention through the Hugging Face modules (the lean decoder, ``speccore.decoder``, runs
  the native kernels' own) runs as batched matmuls with the query heads of one key/value head
  folded into rows, padded to at least ``MIN_QUERY_ROWS`` (matmuls of fewer rows
  take other code paths). The query-key products sum over the head dimension in
  fixed chunks of ``HEAD_DIM_CHUNK``, added in order: on CPUs with AVX-512/AMX a
  GEMM over a longer reduction (gemma's 256) splits it differently for 8 query rows
  than for 40, so a token's scores would depend on the size of its block (measured
  on the project's Xeon hosts; 64-wide reductions give the same bits for any row
  count). The value sum runs over fixed chunks of
  ``kv_cache.KV_BLOCK`` key columns, one matmul per chunk, and adds the chunks in
  order: a GEMM picks its reduction blocking from the reduction length, so one
  matmul over the whole width would sum a row differently when a draft block
  makes the cache one chunk wider. Masked columns add exact zeros.
- speccore's runner hands the mask over already folded and padded, as an additive
  float bias (``fold_mask``), once per forward instead of once per layer; a
  boolean mask (Hugging Face's own, e.g. under ``generate``) is folded here.

- where idle OpenMP threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``, as the services
  run), a small block (``SERIAL_MAX_ROWS`` rows or fewer: decoding and verifying drafts,
  not prefill) runs everything but the packed matmuls on one thread
  (``serial_small_ops``): each parallel region of its element-wise ops, norms, softmax
  and attention matmuls would wait for a sleeping thread to wake, and a block of 6 tokens
  crosses PyTorch's grain size in a few hundred of them a step. Measured on the 2-core
  hosts (smollm2-135m, fp32, 2 threads, ``bench/serial_ops.py``): decoding 9-11 % faster
  under PASSIVE, 2-6 % slower with idle threads spinning (the default policy), where it
  stays off. The thread count changes no bit (a test checks). The engine runs a whole
  decoding step so (``ModelRunner.small_ops``): the verifier's and proposers' torch ops
  over the vocabulary woke the sleeping thread a few times a step as well.

On CUDA the stock kernels stay: there losslessness rests on the verifier alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from speccore import hugepages, native_kernels
from speccore.kv_cache import KV_BLOCK

ATTENTION_NAME = "speccore_row_invariant"
ROWS_HINT = 16
MIN_LINEAR_ROWS = 4
MIN_QUERY_ROWS = 8
HEAD_DIM_CHUNK = 64
# Projections that read one input and are packed into one matmul (Llama-family names).
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Blocks of at most this many rows (batch x tokens) run all but their matmuls on one thread,
# where idle OpenMP threads sleep at once (libgomp reads the policy when the process starts).
SERIAL_MAX_ROWS = 16
IDLE_THREADS_SLEEP = os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


class _Threads(threading.local):
    matmul = 0  # inside serial_small_ops: the threads packed matmuls take; else 0 (as set)


_threads = _Threads()


def matmul_threads() -> int:
    """Inside serial_small_ops: the threads packed matmuls take; else 0 (leave them as set)."""
    return _threads.matmul


@contextlib.contextmanager
def serial_small_ops(rows: int) -> Iterator[None]:
    """Run a forward pass of ``rows`` rows with PyTorch on one thread, except the packed
    matmuls, which keep the threads set before (see the module's docstring). Nothing
    changes where idle threads spin, for a larger block, or on a single thread. Inside
    another such pass (a whole decoding step), a small block changes nothing and a larger
    one gets the threads back for its own duration."""
    outer = _threads.matmul
    if not IDLE_THREADS_SLEEP or (outer and rows <= SERIAL_MAX_ROWS):
        yield
        return
    if outer:  # a large block inside a pass on one thread: the threads back for it
        _threads.matmul = 0
        torch.set_num_threads(outer)
        try:
            yield
        finally:
            _threads.matmul = outer
            torch.set_num_threads(1)
        return
    threads = torch.get_num_threads()
    if rows > SERIAL_MAX_ROWS or threads == 1:
        yield
        return
    _threads.matmul = threads
    torch.set_num_threads(1)
    try:
        yield
    finally:
        _threads.matmul = 0
        torch.set_num_threads(threads)


def available(dtype: torch.dtype) -> bool:
    """Whether packed matmuls run for ``dtype``: speccore's native kernel (float32 and
    bfloat16 on any x86 host it builds on), else oneDNN's."""
    if dtype in (torch.float32, torch.bfloat16) and native_kernels.load() is not None:
        return True
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_matmul(
    rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """[n, in] rows times a weight packed by ``pack`` -> [n, out_features]."""
    threads = _threads.matmul
    if threads:
        torch.set_num_threads(threads)
    if packed.dim() == 4:  # native_kernels' layout
        out = native_kernels.load().linear(rows, packed, out_features, bias)  # type: ignore[union-attr]
    else:
        n = rows.shape[0]
        if n < MIN_LINEAR_ROWS:
            rows = torch.cat([rows, rows.new_zeros(MIN_LINEAR_ROWS - n, rows.shape[1])])
        out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
        out = out[:n] if out.shape[0] != n else out
    if threads:
        torch.set_num_threads(1)
    return out


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in the layout of the kernel that runs it: native_kernels' where it
    is built and takes the shape and dtype, else oneDNN's blocked layout for ROWS_HINT rows."""
    native = native_kernels.load()
    if (
        native is not None
        and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.shape[1] % native.lanes == 0
    ):
        return native.pack(weight.detach())
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


class PackedLinear(nn.Module):
    """``nn.Linear`` whose weight lives in oneDNN's blocked layout; inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed = pack(linear.weight)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = packed_matmul(x.reshape(-1, self.in_features), self.packed, self.bias, self.out_features)
        return out.reshape(*x.shape[:-1], self.out_features)


class PackedGroup(nn.Module):
    """Linears that read the same input, packed as one matmul (weights stacked by rows)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        self.in_features = linears[0].in_features
        self.sizes = [lin.out_features for lin in linears]
        self.out_features = sum(self.sizes)
        self.packed = pack(torch.cat([lin.weight.detach() for lin in linears]))
        biases = [lin.bias for lin in linears]
        self.bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        # The last input and its parts not yet handed out (see part()).
        self._memo: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[..., in] -> one [..., out_i] per member, in order."""
        out = packed_matmul(x.reshape(-1, self.in_features), self.packed, self.bias, self.out_features)
        return [p.reshape(*x.shape[:-1], p.shape[-1]) for p in out.split(self.sizes, -1)]

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Member ``index``'s output for ``x``, computing the whole group once per input.

        Hugging Face's layers call the members in turn with the same tensor object
        (inference tensors carry no version counter, so identity is the test); the
        parts are kept until each has been taken once.
        """
        memo = self._memo
        if memo is None or memo[0] is not x or index not in memo[1]:
            memo = (x, dict(enumerate(self(x))))
        part = memo[1].pop(index)
        self._memo = memo if memo[1] else None
        return part


class PackedPart(nn.Module):
    """One member of a PackedGroup, standing where the original linear stood."""

    def __init__(self, group: PackedGroup, index: int) -> None:
        super().__init__()
        self.in_features = group.in_features
        self.out_features = group.sizes[index]
        # A plain attribute, not a submodule: the group's weight is counted and moved once.
        self.__dict__["group"] = group
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group: PackedGroup = self.__dict__["group"]
        return group.part(x, self.index)


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
    module: nn.Module | None,
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
    scores = _chunked_scores(folded, key) * (scaling if scaling is not None else dim**-0.5)
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


def _chunked_scores(folded: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """[batch, kv_heads, rows, width] query-key products, summed over HEAD_DIM_CHUNK-wide
    slices of the head dimension in order (one matmul when the head is no wider)."""
    dim = folded.shape[-1]
    scores = folded[..., :HEAD_DIM_CHUNK] @ key[..., :HEAD_DIM_CHUNK].transpose(-1, -2)
    for start in range(HEAD_DIM_CHUNK, dim, HEAD_DIM_CHUNK):
        end = start + HEAD_DIM_CHUNK
        scores += folded[..., start:end] @ key[..., start:end].transpose(-1, -2)
    return scores


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
    """Replace every ``nn.Linear`` of ``dtype`` under ``module`` by packed oneDNN matmuls:
    the members of a ``FUSED_GROUPS`` group under one parent by one PackedGroup, any
    other linear by a PackedLinear. ``output`` (the output embedding) keeps its plain
    weight beside the packed copy. The packed weights end up side by side on huge pages
    (``hugepages``): decoding streams them every step.
    """
    packed: list[nn.Module] = []
    for parent in list(module.modules()):
        children = dict(parent.named_children())
        for names in FUSED_GROUPS:
            members = [children.get(n) for n in names]
            linears = [m for m in members if type(m) is nn.Linear and m.weight.dtype == dtype]
            if len(linears) != len(names) or len({(m.in_features, m.bias is None) for m in linears}) != 1:
                continue
            group = PackedGroup(linears)
            packed.append(group)
            parent.add_module("_".join(n.removesuffix("_proj") for n in names), group)
            for index, name in enumerate(names):
                setattr(parent, name, PackedPart(group, index))
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == dtype:
                linear = PackedLinear(child)
                if child is output:
                    # Learned drafts score tokens with the output embedding's rows.
                    linear.weight = child.weight
                packed.append(linear)
                setattr(parent, name, linear)
    hugepages.move(packed, "packed")
