"""The `specops` command line: its JSON contract and one-line errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from heads import save_random_head

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
STRICT_NGRAM = "ngram:ngram_min=3"


def specops(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run(
        [sys.executable, "-m", "specops.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def specops_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`specops` run in this process, for the error cases: the same main() and messages as the
    command, without an interpreter start-up and torch import each (about 8 s here)."""
    from specops.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    return subprocess.CompletedProcess(["specops", *args], code, "", capsys.readouterr().err)


def test_generate_json_contract(smollm):
    out = specops(
        "generate", "--model", MODEL, "--method", "ngram", "--k", "6",
        "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["token_ids"] and isinstance(result["text"], str)
    metrics = result["metrics"]
    for name in (
        "drafted_tokens", "accepted_tokens", "acceptance_rate", "mean_acceptance_length",
        "per_position_acceptance", "draft_time_s", "verify_time_s", "rollbacks", "ttft_s",
        "tpot_s", "tokens_per_s", "extra_memory_bytes",
    ):  # fmt: skip
        assert name in metrics
    assert metrics["new_tokens"] == len(result["token_ids"]) <= 12


def test_generate_streams_text_without_json(smollm):
    out = specops("generate", "--model", MODEL, "--prompt", "Hello", "--chat", "--max-new-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "tok/s" in out.stderr


def test_bench_writes_results(smollm, tmp_path):
    dest = tmp_path / "bench.json"
    out = specops(
        "bench", "--model", MODEL, "--workload", "code", "--methods", f"ngram,hf,{STRICT_NGRAM}",
        "--n-prompts", "2", "--reps", "1", "--max-new-tokens", "8", "--out", str(dest), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(dest.read_text())
    assert json.loads(out.stdout) == result
    assert set(result["methods"]) == {"none", "ngram", "hf", STRICT_NGRAM}
    assert result["methods"]["none"]["speedup_vs_none"] == 1.0
    assert result["methods"]["ngram"]["identical_to_baseline"] is True
    # A family with its knobs set is measured beside the family at its defaults.
    assert result["methods"][STRICT_NGRAM]["identical_to_baseline"] is True
    assert result["methods"]["hf"]["identical_to_baseline"] is True
    assert result["plain_decoding_limit"]["tokens_per_s"] > 0
    # What acceptance alone allows: none is its own limit; identical output in no more
    # steps can only save time; HF's generate reports no steps.
    assert result["methods"]["none"]["free_drafting_limit"] == 1.0
    ngram = result["methods"]["ngram"]
    assert ngram["verify_steps"] <= result["methods"]["none"]["verify_steps"]
    assert ngram["free_drafting_limit"] >= 1.0
    assert "free_drafting_limit" not in result["methods"]["hf"]


def test_bench_with_a_prefix_cache_reuses_the_agents_shared_prompts(smollm, tmp_path):
    dest = tmp_path / "bench.json"
    out = specops(
        "bench", "--model", MODEL, "--workload", "agentic", "--methods", "suffix", "--prefix-cache",
        "--n-prompts", "4", "--reps", "1", "--max-new-tokens", "4", "--out", str(dest),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(dest.read_text())
    assert result["spec"]["prefix_cache"] is True
    for method in ("none", "suffix"):
        # The fourth prompt is the first tool session's second step: the tools and the first
        # step are its prefix.
        assert 0.1 < result["methods"][method]["cached_prompt_fraction"] < 1
    assert result["methods"]["suffix"]["identical_to_baseline"] is True


@pytest.fixture(scope="module")
def heads(smollm, tmp_path_factory) -> dict[str, Path]:
    """Medusa heads trained (here: saved at random) for another hidden size and for the
    target itself."""
    root = tmp_path_factory.mktemp("heads")
    hidden = smollm.model.get_output_embeddings().weight.shape[1]
    ids = torch.arange(256)
    return {
        "wide": save_random_head(smollm, "medusa", root / "wide", ids, hidden_size=hidden + 64),
        "medusa": save_random_head(smollm, "medusa", root / "medusa", ids),
        "eagle": save_random_head(smollm, "eagle", root / "eagle", ids),
    }


def test_bench_runs_a_head_on_prompts_from_a_file(smollm, heads, tmp_path):
    prompts = tmp_path / "heldout.jsonl"
    rows = [
        {"prompt": "Name three fruits.", "completion": "Apple.", "id": "q1"},
        {"prompt": "Hi!", "completion": "Hello."},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dest = tmp_path / "bench.json"
    out = specops(
        "bench", "--model", MODEL, "--workload", "chat", "--prompts", str(prompts),
        "--methods", "medusa,eagle", "--head", str(heads["eagle"]), "--head", str(heads["medusa"]),
        "--n-prompts", "2", "--reps", "1", "--max-new-tokens", "8", "--out", str(dest),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(dest.read_text())
    assert result["prompt_ids"] == ["q1", "heldout.jsonl:1"]
    # Each method took the head it decodes.
    for method in ("medusa", "eagle"):
        assert result["methods"][method]["identical_to_baseline"] is True
        assert result["methods"][method]["per_position_acceptance"]  # it drafted


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", MODEL, "--k", "0", "--method", "ngram"], "k must be a positive"),
        (["--model", MODEL, "--k", "1000", "--method", "ngram"], "too large"),
        (["--model", MODEL, "--prompt", "   "], "prompt is empty"),
        (["--model", MODEL, "--method", "medusa9"], "invalid choice"),
        (["--model", MODEL, "--method", "rest"], "needs --datastore"),
        (["--model", MODEL, "--method", "draft_model", "--draft", "gemma-3-270m"], "different tokenizer"),
        (["--model", MODEL, "--method", "draft_model", "--draft", "self:99"], "self:99"),
        (["--model", MODEL, "--temperature", "-1"], "temperature"),
    ],
)
def test_bad_input_gives_one_line_error(smollm, gemma, args, message, capsys):
    if "--prompt" not in args:
        args = [*args, "--prompt", "hello"]
    out = specops_here(capsys, "generate", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ("ngram,suffix:use_tree_spec", "expected family:knob=value"),
        ("suffix:nope=1", "unknown option 'nope' for suffix"),
        ("suffix:use_tree_spec=yes", "knob use_tree_spec takes a number"),
        ("suffix:use_tree_spec=2", "use_tree_spec is 0 (a path) or 1 (a tree)"),
        ("none:k=2", "plain decoding takes no knobs"),
    ],
)
def test_a_bad_method_variant_gives_one_line_error(methods, message, capsys):
    args = ["--model", MODEL, "--workload", "code", "--methods", methods, "--n-prompts", "1"]
    out = specops_here(capsys, "bench", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_an_unknown_model_gives_one_line_error_offline():
    # A process of its own: with HF_HUB_OFFLINE set it does not wait on an unreachable hub.
    out = specops("generate", "--model", "no-such-model", "--prompt", "hello")
    assert out.returncode == 2
    assert "not a known alias" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize(
    ("method", "head", "message"),
    [
        ("medusa", "wide", "trained for hidden size"),
        ("eagle", "medusa", "holds a medusa head; method 'eagle' decodes eagle and eagle3 heads"),
    ],
)
def test_head_that_does_not_fit_gives_one_line_error(heads, method, head, message, capsys):
    args = ["--model", MODEL, "--method", method, "--prompt", "hello", "--max-new-tokens", "4"]
    out = specops_here(capsys, "generate", *args, "--head", str(heads[head]))
    assert out.returncode == 2
    assert out.stderr.startswith("specops: error:")
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_prompt_longer_than_context(smollm, tmp_path: Path, capsys):
    prompt = tmp_path / "long.txt"
    prompt.write_text("token " * (smollm.max_context + 10))
    out = specops_here(capsys, "generate", "--model", MODEL, "--prompt-file", str(prompt))
    assert out.returncode == 2
    assert "exceeds the model's context" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_missing_prompt_file(capsys):
    out = specops_here(capsys, "generate", "--model", MODEL, "--prompt-file", "/nonexistent/prompt.txt")
    assert out.returncode == 2
    assert "cannot read prompt file" in out.stderr


def test_tree_option_help_states_the_engine_defaults():
    from speccore.proposers.base import ProposerConfig

    out = specops("generate", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    defaults = ProposerConfig()
    assert f"children per expanded node (default {defaults.tree_topk})" in text
    assert f"draft nodes per step (default {defaults.tree_tokens})" in text
