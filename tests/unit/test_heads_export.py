"""`specops heads export`: an EAGLE-3 head as a speculators checkpoint that vLLM loads —
the verifier vLLM can resolve, the measured k, the dtype — checked through the
``speculators`` package's own config classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures.speculators import INSTALL, SpeculatorsConfigs, load_config_classes
from safetensors.torch import load_file

from speccore.heads.artifact import HeadConfig, save_head
from speccore.heads.eagle import EagleHead
from speccore.heads.speculators import SCHEMA_VERSION, export_speculators
from speccore.models import HUB_IDS, hub_id

MODEL = "smollm2-135m-instruct"


def eagle3_head(out: Path, *, hidden: int = 32, vocab: int = 100, draft: int = 50) -> Path:
    """A small untrained EAGLE-3 head on disk that scores the first ``draft`` even ids."""
    torch.manual_seed(0)
    config = HeadConfig(
        family="eagle3", hidden_size=hidden, vocab_size=vocab, draft_vocab_size=draft,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, feature_layers=[1, 2],
    )  # fmt: skip
    head = EagleHead(config).eval()
    head.draft_ids.copy_(torch.arange(0, 2 * draft, 2))
    save_head(out, config, head)
    return out


@pytest.fixture(scope="module")
def speculators() -> SpeculatorsConfigs:
    classes = load_config_classes()
    if classes is None:
        pytest.skip(f"speculators is not installed ({INSTALL})")
    return classes


def test_eagle3_head_exports_in_the_speculators_layout(tmp_path: Path) -> None:
    embeddings = torch.randn(100, 32)
    out = export_speculators(
        eagle3_head(tmp_path / "head"), tmp_path / "spec", "my/target", embeddings, ["LlamaForCausalLM"],
        speculative_tokens=3,
    )  # fmt: skip
    spec = json.loads((out / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3"
    assert spec["speculators_config"]["verifier"]["name_or_path"] == "my/target"
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 3]  # vLLM taps layer inputs
    assert spec["draft_vocab_size"] == 50 and spec["transformer_layer_config"]["vocab_size"] == 100
    # The head was saved in float16: the export keeps it, and says so where vLLM reads it.
    assert spec["dtype"] == spec["transformer_layer_config"]["dtype"] == "float16"
    tensors = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.float16}
    assert tensors["fc.weight"].shape == (32, 64)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 64  # attention reads [embedding; feature]
    assert "layers.0.hidden_norm.weight" in tensors and tensors["lm_head.weight"].shape == (50, 32)
    assert torch.equal(torch.arange(50) + tensors["d2t"], torch.arange(0, 100, 2))
    assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), torch.arange(0, 100, 2))
    assert torch.equal(tensors["embed_tokens.weight"], embeddings.half())


def test_the_export_casts_to_the_dtype_asked_for(tmp_path: Path) -> None:
    out = export_speculators(
        eagle3_head(tmp_path / "head"), tmp_path / "spec", "my/target", torch.randn(100, 32), ["X"],
        speculative_tokens=5, dtype="bfloat16",
    )  # fmt: skip
    tensors = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_offline_aliases_export_the_repo_vllm_resolves(tmp_path: Path) -> None:
    assert hub_id(MODEL) == "HuggingFaceTB/SmolLM2-135M-Instruct" == HUB_IDS[MODEL]
    assert hub_id("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert hub_id(str(tmp_path)) is None and hub_id("model.gguf") is None  # only this host reads them


def test_speculators_loads_the_export_as_eagle3(tmp_path: Path, speculators: SpeculatorsConfigs) -> None:
    out = export_speculators(
        eagle3_head(tmp_path / "head"), tmp_path / "spec", "HuggingFaceTB/SmolLM2-135M-Instruct",
        torch.randn(100, 32), ["LlamaForCausalLM"], speculative_tokens=4,
    )  # fmt: skip
    loaded = speculators.model.from_pretrained(str(out), local_files_only=True)
    assert isinstance(loaded, speculators.eagle3)
    assert loaded.speculators_config.verifier.name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert loaded.speculators_config.proposal_methods[0].speculative_tokens == 4
    assert loaded.draft_vocab_size == 50 and loaded.target_hidden_size == 32
    assert loaded.transformer_layer_config.vocab_size == 100
    assert loaded.eagle_aux_hidden_state_layer_ids == [2, 3]
    # The version it records is the installed release, the one whose schema validated it.
    assert loaded.speculators_version == speculators.version == SCHEMA_VERSION
    # What vLLM's SpeculatorsConfig.validate_speculators_config requires, present after
    # the round trip through speculators' own serialisation.
    saved = loaded.to_dict()
    assert saved["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert isinstance(saved["transformer_layer_config"], dict)


def test_speculators_rejects_a_broken_export(tmp_path: Path, speculators: SpeculatorsConfigs) -> None:
    """The check has teeth: a config its classes would not load fails the same way."""
    out = export_speculators(
        eagle3_head(tmp_path / "head"), tmp_path / "spec", "my/target", torch.randn(100, 32), ["X"],
        speculative_tokens=4,
    )  # fmt: skip
    spec = json.loads((out / "config.json").read_text())
    spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 0
    with pytest.raises(ValueError, match="speculative_tokens"):
        speculators.model.from_dict(spec)


def specops(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "specops.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


@pytest.mark.slow
def test_export_command_names_the_hub_repo_and_the_winners_k(tmp_path: Path) -> None:
    head = eagle3_head(tmp_path / "head", hidden=576, vocab=49_152, draft=64)  # smollm2-135m's sizes
    out = tmp_path / "x"
    done = specops("heads", "export", "--head", str(head), "--target", MODEL, "--k", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    spec = json.loads((out / "config.json").read_text())
    assert spec["speculators_config"]["verifier"] == {
        "name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "architectures": ["LlamaForCausalLM"],
    }
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3


def test_export_command_refuses_a_verifier_only_this_host_can_read(tmp_path: Path) -> None:
    head = eagle3_head(tmp_path / "head")
    local = str(tmp_path)
    done = specops("heads", "export", "--head", str(head), "--target", local, "--k", "3", "--out", "x")
    assert done.returncode == 2
    assert "--verifier-name" in done.stderr and "Traceback" not in done.stderr
    missing_k = specops("heads", "export", "--head", str(head), "--target", MODEL, "--out", "x")
    assert missing_k.returncode == 2 and "--k" in missing_k.stderr
