"""The lean decoder runs Llama-family layers on speccore's native kernels: the arithmetic of
their Hugging Face modules, equal within float rounding (its sums run in another order), so
the same model gives the same hidden states and tokens through either path. Its row
invariance (a block's rows get the bits of one-token passes) is tested in test_cpu_kernels."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PretrainedConfig, Qwen2Config

from speccore import cpu_kernels
from speccore.models import LoadedModel
from speccore.runner import ModelRunner

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def _tiny(config: PretrainedConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    cpu_kernels.install(model, torch.float32)
    return model


def _both_paths(model: torch.nn.Module) -> tuple[ModelRunner, ModelRunner]:
    lean = ModelRunner(model)
    assert lean.lean is not None, "the lean decoder should serve this model"
    stock = ModelRunner(model)
    stock.lean = None  # the same model through its Hugging Face modules
    return lean, stock


@torch.inference_mode()
def _assert_same_states(model: torch.nn.Module, vocab: int, taps: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab, (2, 40), generator=gen)
    chain = torch.randint(0, vocab, (2, 6), generator=gen)
    tree = torch.randint(0, vocab, (2, 5), generator=gen)
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 0, 3]])  # block-relative, root first
    results = []
    for runner in _both_paths(model):
        cache = runner.new_cache(2, 256)
        steps = [runner.forward_tapped(cache, prompts, taps=taps)]
        cache.commit(torch.tensor([40, 33]))  # rows of different lengths
        steps.append(runner.forward_tapped(cache, chain, taps=taps))
        cache.commit(torch.tensor([1, 4]))
        steps.append(runner.forward_tapped(cache, tree, parents, taps=taps))
        results.append(steps)
    for step, ((lean, lean_taps), (stock, stock_taps)) in enumerate(zip(*results, strict=True)):
        _assert_rounding_apart(lean, stock, f"step {step}: hidden states differ")
        assert (lean_taps is None) == (stock_taps is None)
        if lean_taps is not None and stock_taps is not None:
            _assert_rounding_apart(lean_taps, stock_taps, f"step {step}: tapped layers differ")


def _assert_rounding_apart(lean: torch.Tensor, stock: torch.Tensor, msg: str) -> None:
    """Equal but for float32 rounding, at the scale of the tensor (a residual stream reaches
    the tens of thousands in some channels, where one rounding step is about 0.002)."""
    scale = float(stock.abs().max())
    torch.testing.assert_close(lean, stock, rtol=1e-3, atol=1e-6 * scale, msg=msg)


@pytest.mark.parametrize(
    "config",
    [
        LlamaConfig(**TINY),
        Qwen2Config(**TINY),  # q/k/v with biases
        MistralConfig(**TINY, sliding_window=None),
    ],
    ids=["llama", "qwen2", "mistral"],
)
def test_tiny_llama_family_models_get_the_hugging_face_states(config: PretrainedConfig) -> None:
    _assert_same_states(_tiny(config), int(config.vocab_size), taps=(0, 1))


@pytest.mark.slow
def test_smollm2_gets_the_hugging_face_states(smollm: LoadedModel) -> None:
    _assert_same_states(smollm.model, 49152, taps=(4, 15, 27))


@pytest.mark.slow
def test_other_layouts_keep_the_hugging_face_path(gemma: LoadedModel) -> None:
    """Gemma's extra norms and sliding windows are not Llama layers; a model on stock
    kernels has no fused projections."""
    assert ModelRunner(gemma.model).lean is None
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(LlamaConfig(**TINY), attn_implementation="sdpa").eval()
    assert ModelRunner(stock).lean is None
