"""On CPU a token's logits are bit-identical whether it is verified in a draft block,
in a padded batch, or decoded alone: chain speculation cannot change greedy output
even at a near-tie. (Tree nodes sit at other cache columns than the chain they stand
for, so their attention sums in another order: equal within rounding, see
test_kv_cache.py.)"""

from __future__ import annotations

import pytest
import torch

from speccore.cpu_kernels import fold_mask, row_invariant_attention
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
