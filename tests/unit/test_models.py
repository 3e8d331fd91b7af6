"""Model loading: offline aliases, the safetensors cache of dequantized GGUF files, errors.

The tests share the suite's model cache (SPECOPS_CACHE_DIR or the user cache
directory): on a fresh machine the first load dequantizes each alias (about 30 s
for smollm2, 100 s for gemma on 2 CPU cores) and every later load reads the cache.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM, ViTConfig

from speccore import cpu_kernels
from speccore.errors import SpecError
from speccore.models import ALIASES, LoadedModel, cache_root, file_sha256, load_model, resolve_alias


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The cache the whole suite shares, so each alias is dequantized once per machine."""
    return cache_root()


@pytest.fixture
def smollm2(smollm: LoadedModel) -> LoadedModel:
    return smollm


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a network the hub client retries for ~30 s before giving up.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _logits(lm: LoadedModel, model: torch.nn.Module, text: str) -> torch.Tensor:
    ids = torch.tensor([lm.encode_prompt(text, chat=False)])
    with torch.no_grad():
        return model(ids).logits  # [1, seq, vocab]


@pytest.mark.slow
def test_alias_is_cached_with_identical_logits(smollm2: LoadedModel, model_cache: Path) -> None:
    source = Path(smollm2.source)
    assert source.parent == model_cache / "models"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in source.iterdir()}
    assert not [p for p in source.parent.iterdir() if p.name.startswith(".")], "staging dir left behind"

    gguf = Path(resolve_alias("smollm2-135m-instruct"))
    fresh = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cpu_kernels.install(fresh, torch.float32)  # as load_model does, so both run the same kernels
    text = "def fibonacci(n):\n    return"
    assert torch.equal(_logits(smollm2, fresh, text), _logits(smollm2, smollm2.model, text))


@pytest.mark.slow
def test_second_load_reads_the_cache(smollm2: LoadedModel, caplog: pytest.LogCaptureFixture) -> None:
    gguf_path = resolve_alias("smollm2-135m-instruct")
    with caplog.at_level(logging.INFO, logger="speccore.models"):
        again = load_model("smollm2-135m-instruct", device="cpu")
        by_path = load_model(gguf_path, device="cpu")
    assert "dequantizing" not in caplog.text
    assert again.source == by_path.source == smollm2.source
    assert by_path.ref == gguf_path
    text = "The quick brown fox"
    assert torch.equal(_logits(again, again.model, text), _logits(smollm2, smollm2.model, text))


@pytest.mark.slow
def test_smollm2_properties(smollm2: LoadedModel) -> None:
    model = smollm2.model
    assert type(model).__name__ == "LlamaForCausalLM"
    assert smollm2.device == torch.device("cpu") and smollm2.dtype == torch.float32
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # On CPU the row-invariant kernels are installed (see test_cpu_kernels.py).
    assert model.config._attn_implementation == cpu_kernels.ATTENTION_NAME
    assert isinstance(model.lm_head, cpu_kernels.PackedLinear)
    # 135 M fp32 parameters; lm_head is tied to the embedding and counted once.
    assert 130e6 < smollm2.weight_bytes / 4 < 140e6
    assert smollm2.max_context == 8192
    assert smollm2.eos_token_ids == {smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")}


@pytest.mark.slow
def test_bf16_load_halves_the_weights(smollm2: LoadedModel) -> None:
    half = load_model("smollm2-135m-instruct", device="cpu", dtype="bf16")
    assert half.dtype == torch.bfloat16
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert half.weight_bytes * 2 == smollm2.weight_bytes


@pytest.mark.slow
def test_encode_prompt_chat_and_plain(smollm2: LoadedModel) -> None:
    text = "Write a haiku about caches."
    chat_ids = smollm2.encode_prompt(text, chat=True)
    rendered = smollm2.tokenizer.decode(chat_ids)
    assert "<|im_start|>user\n" + text + "<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    assert smollm2.encode_prompt(text, chat=False) == smollm2.tokenizer(text).input_ids
    assert smollm2.tokenizer.decode(smollm2.encode_prompt(text, chat=False)) == text


@pytest.mark.slow
def test_gemma_loads_and_generates(gemma: LoadedModel) -> None:
    assert type(gemma.model).__name__ == "Gemma3ForCausalLM"
    assert gemma.max_context == 32768
    assert gemma.eos_token_ids == {1}
    prompt = gemma.encode_prompt("The capital of France is", chat=False)
    assert prompt[0] == gemma.tokenizer.bos_token_id

    ids = torch.tensor([prompt])
    generated = gemma.model.generate(ids, max_new_tokens=8, do_sample=False)[0, len(prompt) :].tolist()
    # The same greedy tokens by recomputing the whole sequence each step (no KV cache).
    expected: list[int] = []
    with torch.no_grad():
        for _ in range(8):
            logits = gemma.model(torch.tensor([prompt + expected])).logits  # [1, seq, vocab]
            expected.append(int(logits[0, -1].argmax()))
    assert generated == expected
    # A mis-dequantized Gemma (e.g. norm weights off by one) babbles; this one does not.
    assert gemma.tokenizer.decode(generated).startswith(" the capital of the country")


@pytest.mark.slow
def test_gemma_has_no_chat_template(gemma: LoadedModel) -> None:
    with pytest.raises(SpecError, match="no chat template"):
        gemma.encode_prompt("hello", chat=True)
    # A workload's chat prompt reaches this base model as its plain text, as it is used.
    assert gemma.encode_user_prompt("hello", chat=True) == gemma.encode_prompt("hello", chat=False)


def test_aliases_are_the_offline_models() -> None:
    assert set(ALIASES) == {"smollm2-135m-instruct", "gemma-3-270m"}
    assert resolve_alias("some-org/some-model") == "some-org/some-model"


@pytest.mark.usefixtures("offline_hub")
def test_unknown_alias_names_the_offline_aliases() -> None:
    with pytest.raises(SpecError) as err:
        load_model("smollm2", device="cpu")
    message = str(err.value)
    assert "'smollm2' is not a known alias, a local path or a reachable Hugging Face id" in message
    assert "did you mean 'smollm2-135m-instruct'" in message
    assert "gemma-3-270m" in message and "\n" not in message


@pytest.mark.usefixtures("offline_hub")
def test_unreachable_hub_id() -> None:
    with pytest.raises(SpecError, match="'foo/bar' is not a known alias"):
        load_model("foo/bar", device="cpu")


@pytest.mark.parametrize("ref", ["/nonexistent/model", "./no-such-dir", "missing.gguf"])
def test_missing_path(ref: str) -> None:
    with pytest.raises(SpecError, match="no such model file or directory"):
        load_model(ref, device="cpu")


def test_directory_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot load model"):
        load_model(str(tmp_path), device="cpu")


def test_plain_file_is_rejected(tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(SpecError, match="neither a .gguf file nor a model directory"):
        load_model(str(weights), device="cpu")


def test_not_a_causal_lm(tmp_path: Path) -> None:
    ViTConfig().save_pretrained(tmp_path)
    with pytest.raises(SpecError, match=r"\(vit\) is not a causal language model"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.parametrize(
    ("device", "dtype", "match"),
    [
        ("cpu", "float8", "unknown dtype 'float8'"),
        ("tpu", "auto", "unknown device 'tpu'"),
        ("meta", "auto", "unsupported device 'meta'"),
    ],
)
def test_bad_device_or_dtype(device: str, dtype: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        load_model("smollm2-135m-instruct", device=device, dtype=dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda() -> None:
    with pytest.raises(SpecError, match="CUDA is not available"):
        load_model("smollm2-135m-instruct", device="cuda")


def test_file_hash_is_remembered_but_follows_changes(tmp_path: Path) -> None:
    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"a" * 1000)
    first = file_sha256(blob)
    assert file_sha256(blob) == first
    blob.write_bytes(b"b" * 1000)  # same size: only the mtime tells the change
    os.utime(blob, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns + 1_000_000))
    assert file_sha256(blob) != first
