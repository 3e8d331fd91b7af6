"""On CPU a token's logits are bit-identical whether it is verified in a draft block,
in a padded batch, or decoded alone: chain speculation cannot change greedy output
even at a near-tie. (Tree nodes sit at other cache columns than the chain they stand
for, so their attention sums in another order: equal within rounding, see
test_kv_cache.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from speccore import cpu_kernels, native_kernels
from speccore.cpu_kernels import (
    MIN_LINEAR_ROWS,
    PackedGroup,
    PackedLinear,
    PackedPart,
    fold_mask,
    pack_linears,
    row_invariant_attention,
)
from speccore.kv_cache import KV_BLOCK
from speccore.models import LoadedModel
from speccore.runner import ModelRunner

pytestmark = pytest.mark.slow

PREFIX = 120
BLOCK = 10


def _one_at_a_time(runner: ModelRunner, prefix: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """[BLOCK, vocab] logits of each block token fed alone after its predecessors."""
    cache = runner.new_cache(1, 1024)
    runner.forward(cache, prefix[None])
    cache.commit(torch.tensor([len(prefix)]))
    rows = []
    for j in range(len(block)):
        rows.append(runner.logits(runner.forward(cache, block[None, j : j + 1]))[0, 0])
        cache.commit(torch.tensor([1]))
    return torch.stack(rows)


@pytest.mark.parametrize("model_name", ["smollm", "gemma"])
@torch.inference_mode()
def test_block_and_batch_logits_equal_single_token_logits_bit_for_bit(
    model_name: str, request: pytest.FixtureRequest
) -> None:
    target: LoadedModel = request.getfixturevalue(model_name)
    runner = ModelRunner(target.model)
    gen = torch.Generator().manual_seed(7)
    prefixes = torch.randint(100, 30000, (3, PREFIX), generator=gen)
    blocks = torch.randint(100, 30000, (3, BLOCK), generator=gen)

    cache = runner.new_cache(3, 1024)
    runner.forward(cache, prefixes)
    cache.commit(torch.full((3,), PREFIX))
    batched = runner.logits(runner.forward(cache, blocks))  # [3, BLOCK, vocab]

    for row in range(3):
        alone = _one_at_a_time(runner, prefixes[row], blocks[row])
        assert torch.equal(batched[row], alone), f"row {row} differs from decoding alone"


def test_a_decoding_step_keeps_small_blocks_on_one_thread_and_gives_large_ones_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine holds serial_small_ops for a whole step: a small block inside keeps the
    step's single thread, a large one (a prefill) gets every thread for itself, and the
    caller's thread count is back after each."""
    monkeypatch.setattr(cpu_kernels, "IDLE_THREADS_SLEEP", True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with cpu_kernels.serial_small_ops(1):
            assert (torch.get_num_threads(), cpu_kernels.matmul_threads()) == (1, 2)
            with cpu_kernels.serial_small_ops(cpu_kernels.SERIAL_MAX_ROWS):
                assert (torch.get_num_threads(), cpu_kernels.matmul_threads()) == (1, 2)
            with cpu_kernels.serial_small_ops(cpu_kernels.SERIAL_MAX_ROWS + 1):
                assert (torch.get_num_threads(), cpu_kernels.matmul_threads()) == (2, 0)
            assert (torch.get_num_threads(), cpu_kernels.matmul_threads()) == (1, 2)
        assert (torch.get_num_threads(), cpu_kernels.matmul_threads()) == (2, 0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("model_name", ["smollm", "gemma"])
@torch.inference_mode()
def test_small_blocks_on_one_thread_give_the_bits_of_all_threads(
    model_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where idle threads sleep, a decoding step's small ops run on one thread
    (serial_small_ops): each block size a step takes gives the logits it gives with every
    op on two threads, and the caller's thread count is back afterwards."""
    monkeypatch.setattr(cpu_kernels, "IDLE_THREADS_SLEEP", True)
    runner = ModelRunner(request.getfixturevalue(model_name).model)
    gen = torch.Generator().manual_seed(8)
    prefix = torch.randint(100, 30000, (1, PREFIX), generator=gen)
    blocks = [torch.randint(100, 30000, (1, q), generator=gen) for q in (1, 6, 16)]
    seen: list[int] = []  # the threads ops after the output matmul get
    assert runner.head is not None
    hook = runner.head.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs: dict[int, list[torch.Tensor]] = {}
        for serial_rows in (cpu_kernels.SERIAL_MAX_ROWS, 0):  # 0: no block is small
            monkeypatch.setattr(cpu_kernels, "SERIAL_MAX_ROWS", serial_rows)
            cache = runner.new_cache(1, 1024)
            runner.forward(cache, prefix)
            cache.commit(torch.tensor([PREFIX]))
            seen.clear()
            outs[serial_rows] = [runner.logits(runner.forward(cache, block)) for block in blocks]
            assert seen == [1 if serial_rows else 2] * len(blocks)
            assert torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    serial, parallel = outs.values()
    for block, one, two in zip(blocks, serial, parallel, strict=True):
        assert torch.equal(one, two), f"a block of {block.shape[1]} changes with its small ops' threads"


@torch.inference_mode()
def test_attention_rows_do_not_depend_on_the_key_width() -> None:
    """A draft block can make the cache one KV_BLOCK wider than decoding alone would;
    stock matmuls re-block their reduction with the width (here 256 and 320 columns
    sum differently from 384+), the row-invariant attention must not."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim = 9, 3, 64
    keys = torch.randn(1, kv_heads, 1024, dim, generator=gen)
    values = torch.randn(1, kv_heads, 1024, dim, generator=gen)
    for real in (5, 129, 200, 300, 700):
        query = torch.randn(1, heads, 1, dim, generator=gen)
        outs = []
        for width in range(-(-(real + 1) // KV_BLOCK) * KV_BLOCK, 1025, KV_BLOCK):
            mask = (torch.arange(width) <= real)[None, None, None, :]
            out, _ = row_invariant_attention(None, query, keys[:, :, :width], values[:, :, :width], mask)
            folded, _ = row_invariant_attention(
                None, query, keys[:, :, :width], values[:, :, :width], fold_mask(mask, heads // kv_heads)
            )
            assert torch.equal(out, folded), "a pre-folded mask must give the boolean mask's bits"
            outs.append(out)
        assert all(torch.equal(o, outs[0]) for o in outs), f"{real} columns: output depends on the width"


@torch.inference_mode()
def test_packed_rows_do_not_depend_on_how_many_share_the_call() -> None:
    """One row alone, padded to MIN_LINEAR_ROWS, gets the bits it gets among 2-48 rows;
    a fused group gives each member the bits of that member packed alone."""
    gen = torch.Generator().manual_seed(5)
    linears = [torch.nn.Linear(576, n, bias=True) for n in (576, 192, 192)]
    for lin in linears:
        torch.nn.init.normal_(lin.weight, generator=gen)
    group = PackedGroup(linears)
    alone = [PackedLinear(lin) for lin in linears]
    x = torch.randn(48, 576, generator=gen)
    first = [a(x[:1]) for a in alone]
    for n in (1, 2, 3, MIN_LINEAR_ROWS, 6, 7, 11, 16, 17, 48):
        for member, (fused, single) in enumerate(zip(group(x[:n]), alone, strict=True)):
            assert torch.equal(fused, single(x[:n])), f"{n} rows: fused member {member} differs"
            assert torch.equal(fused[:1], first[member]), f"row 0 changes with {n} rows sharing the call"


@torch.inference_mode()
def test_hugging_face_layers_read_fused_projections_one_member_at_a_time() -> None:
    """After packing, q/k/v and gate/up stand as parts of one matmul; a module calling
    them one by one gets what the unfused layers give, and nothing is kept afterwards."""
    gen = torch.Generator().manual_seed(6)
    attn = torch.nn.Module()
    for name, out in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)):
        lin = torch.nn.Linear(64, out, bias=False)
        torch.nn.init.normal_(lin.weight, generator=gen)
        attn.add_module(name, lin)
    plain = {name: PackedLinear(getattr(attn, name)) for name in ("q_proj", "k_proj", "v_proj")}
    pack_linears(attn, torch.float32)
    assert all(isinstance(getattr(attn, n), PackedPart) for n in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(attn.o_proj, PackedLinear)
    x = torch.randn(3, 5, 64, generator=gen)
    for name in ("k_proj", "q_proj", "v_proj"):  # any order
        assert torch.equal(getattr(attn, name)(x), plain[name](x))
    group = attn.q_proj.__dict__["group"]
    assert group._memo is None, "parts of an input outlive their last use"
    other = torch.randn(2, 64, generator=gen)
    assert torch.equal(attn.v_proj(other), plain["v_proj"](other))  # a new input is recomputed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_native_matmul_rows_do_not_depend_on_the_row_count(dtype: torch.dtype) -> None:
    """speccore's native matmul (built for this host): a row gets the same bits alone, in a
    verify-sized block or in a prefill of 100 rows, in float32 and in bfloat16, and the
    product is the matrix product (outputs not a multiple of the tile, with a bias)."""
    native = native_kernels.load()
    assert native is not None, "the native kernels should build on the test hosts (make setup)"
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(577, 576, generator=gen).to(dtype)
    bias = torch.randn(577, generator=gen)
    x = torch.randn(100, 576, generator=gen).to(dtype)
    packed = native.pack(weight)
    full = native.linear(x, packed, 577, bias)
    for n in (1, 2, 3, 4, 5, 6, 7, 16, 17, 48, 99):
        assert torch.equal(native.linear(x[:n], packed, 577, bias), full[:n]), f"{n} rows differ"
    assert torch.equal(native.linear(x[57:58], packed, 577, bias)[0], full[57])
    expected = x.float() @ weight.float().T + bias
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(full.float(), expected, rtol=tol, atol=tol * float(expected.abs().max()))


@torch.inference_mode()
def test_bfloat16_block_logits_equal_single_token_logits_bit_for_bit(smollm_bf16: LoadedModel) -> None:
    """`--dtype bfloat16` on CPU: the same row invariance as float32, on any x86 host."""
    runner = ModelRunner(smollm_bf16.model)
    assert runner.lean is not None
    gen = torch.Generator().manual_seed(9)
    prefix = torch.randint(100, 30000, (PREFIX,), generator=gen)
    block = torch.randint(100, 30000, (BLOCK,), generator=gen)
    cache = runner.new_cache(1, 1024)
    runner.forward(cache, prefix[None])
    cache.commit(torch.tensor([PREFIX]))
    together = runner.logits(runner.forward(cache, block[None]))[0]
    assert torch.equal(together, _one_at_a_time(runner, prefix, block))


def test_without_the_native_kernels_speccore_falls_back_to_onednn_and_stays_row_invariant() -> None:
    """SPECOPS_NATIVE_KERNELS=0 (or a host without a C++ compiler): oneDNN's packed matmuls
    and the Hugging Face path, a block's logits still equal to one-token passes."""
    script = """
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from speccore import cpu_kernels, native_kernels
from speccore.runner import ModelRunner
assert native_kernels.load() is None
torch.manual_seed(0)
config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
assert cpu_kernels.install(model, torch.float32)
runner = ModelRunner(model)
assert runner.lean is None and model.model.layers[0].mlp.down_proj.packed.dim() == 2
with torch.inference_mode():
    tokens = torch.randint(0, 512, (1, 30))
    cache = runner.new_cache(1, 128)
    together = runner.logits(runner.forward(cache, tokens))[0]
    cache = runner.new_cache(1, 128)
    for j in range(30):
        row = runner.logits(runner.forward(cache, tokens[:, j : j + 1]))[0, 0]
        cache.commit(torch.tensor([1]))
        assert torch.equal(row, together[j]), j
print("ok")
"""
    env = {**os.environ, native_kernels.OFF_ENV: "0"}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
