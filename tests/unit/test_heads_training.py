"""Training learned drafts: the unrolled head equals step-by-step drafting, runs
resume after a kill with the same result, bad input is refused clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from speccore.heads.artifact import HeadConfig
from speccore.heads.eagle import EagleHead
from speccore.training.data import write_examples
from speccore.training.eagle import unroll, unroll_mask
from specprompts.examples import sharegpt_examples

MODEL = "smollm2-135m-instruct"


def tiny_eagle(family: str = "eagle") -> EagleHead:
    torch.manual_seed(0)
    taps = [1, 2] if family == "eagle3" else []
    config = HeadConfig(
        family=family, hidden_size=32, vocab_size=50, draft_vocab_size=50, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, feature_layers=taps,
    )  # fmt: skip
    return EagleHead(config).eval()


def test_unroll_mask_gives_each_draft_step_its_decoding_context():
    mask = unroll_mask(length=4, steps=3)
    entry = lambda s, p: s * 4 + p  # noqa: E731
    # The second draft after target entry 1 (step 2 at position 3) sees target entries
    # 0..1, the first draft (step 1 at 2) and itself, nothing else.
    seen = {(s, p) for s in range(3) for p in range(4) if mask[entry(2, 3), entry(s, p)]}
    assert seen == {(0, 0), (0, 1), (1, 2), (2, 3)}
    # Step 0 is plain causal attention over target-fed entries.
    assert torch.equal(mask[:4, :4], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert not mask[:4, 4:].any()


@pytest.mark.parametrize("family", ["eagle", "eagle3"])
def test_unrolled_head_equals_drafting_step_by_step(family):
    """Step s of the unroll at position q+s is the (s+1)-th draft of a chain grown from
    target entry q, each step reading the previous step's output (EAGLE decoding)."""
    head = tiny_eagle(family)
    length, steps = 7, 3
    gen = torch.Generator().manual_seed(1)
    embeds = torch.randn(length, 32, generator=gen)
    feats = torch.randn(length, 64 if family == "eagle3" else 32, generator=gen)
    with torch.no_grad():
        unrolled = unroll(head, embeds, feats, steps)
        for q in range(length - steps + 1):
            fed = [head.inputs(embeds[: q + 1], head.target_feature(feats[: q + 1]))]
            out = head.layer(inputs_embeds=torch.cat(fed)[None]).last_hidden_state[0, -1]
            torch.testing.assert_close(unrolled[0, q], out, rtol=1e-4, atol=1e-5)
            for s in range(1, steps):
                fed.append(head.inputs(embeds[q + s][None], out[None]))
                out = head.layer(inputs_embeds=torch.cat(fed)[None]).last_hidden_state[0, -1]
                torch.testing.assert_close(unrolled[s, q + s], out, rtol=1e-4, atol=1e-5)


def specops(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "specops.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=full_env, **kw,
    )  # fmt: skip


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = specops(*args, env=env)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def train_args(data: Path, out: Path) -> list[str]:
    return [
        "heads", "train", "--target", MODEL, "--family", "eagle", "--data", str(data),
        "--heldout", str(data.with_name("heldout.jsonl")), "--epochs", "3", "--draft-vocab", "512",
        "--max-len", "96", "--batch-tokens", "200", "--checkpoint-every", "1", "--threads", "1",
        "--quiet", "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("heads-data")
    examples = sharegpt_examples(20, seed=3)
    write_examples(root / "train.jsonl", examples[:16])
    write_examples(root / "heldout.jsonl", examples[16:])
    return root / "train.jsonl"


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory) -> tuple[Path, dict]:
    """A tiny EAGLE head trained for three epochs without interruption."""
    out = tmp_path_factory.mktemp("whole")
    code, stdout, err = run(*train_args(data, out))
    assert code == 0, err
    return out, json.loads(stdout)


@pytest.mark.slow
@pytest.mark.long  # a minute here; make test keeps test_training_continues_from_a_trained_head
def test_training_killed_midway_resumes_to_the_same_head(data, whole, tmp_path):
    whole_dir, whole = whole
    assert whole["resumed_from_step"] is None and whole["stopped_by"] == "epochs"
    config = json.loads((whole_dir / "config.json").read_text())
    curve = config["provenance"]["curve"]
    assert [r["epoch"] for r in curve] == [0, 1, 2, 3]  # 0: measured before training
    assert curve[-1]["train_loss"] < curve[1]["train_loss"]  # it learns something
    assert "chain_mean_acceptance_length" in curve[-1]["heldout"]
    assert not (whole_dir / "checkpoint.pt").exists()

    proc = specops(*train_args(data, tmp_path / "killed"))
    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert checkpoint.exists(), "the run was killed before (or finished without) a checkpoint"

    code, out, err = run(*train_args(data, tmp_path / "killed"))
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["resumed_from_step"] >= 1
    assert resumed["steps"] == whole["steps"]
    a, b = (
        load_file(str(whole_dir / "head.safetensors")),
        load_file(str(tmp_path / "killed" / "head.safetensors")),
    )
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_training_continues_from_a_trained_head(data, whole, tmp_path):
    whole_dir, _ = whole
    before = json.loads((whole_dir / "config.json").read_text())["provenance"]["heldout_acceptance"]
    args = train_args(data, tmp_path / "more")
    args[args.index("--epochs") + 1] = "1"
    code, out, err = run(*args, "--init-from", str(whole_dir))
    assert code == 0, err
    provenance = json.loads((tmp_path / "more" / "config.json").read_text())["provenance"]
    start = provenance["curve"][0]["heldout"]["chain_mean_acceptance_length"]  # before the first step
    assert start == pytest.approx(before["chain_mean_acceptance_length"], abs=0.02)  # the head given
    assert start > 1.0  # not an untrained head
    assert provenance["plan"]["init_from"] == str(whole_dir)
    assert provenance["init_weights"].startswith("sha256:")
    ids = [load_file(str(d / "head.safetensors"))["draft_ids"] for d in (whole_dir, tmp_path / "more")]
    assert torch.equal(*ids)  # it goes on scoring the vocabulary its weights were trained on

    # Another draft vocabulary size cannot reuse the head's output rows: refused, saying why.
    other = train_args(data, tmp_path / "other")
    other[other.index("--draft-vocab") + 1] = "256"
    code, _, err = run(*other, "--init-from", str(whole_dir))
    assert code == 2
    assert "draft vocabulary of 512 tokens; this run plans 256" in err and "Traceback" not in err


@pytest.mark.slow
def test_malformed_training_line_is_reported_with_its_line_number(tmp_path):
    bad = tmp_path / "data.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": 3}\n')
    code, _, err = run("heads", "train", "--target", MODEL, "--family", "medusa", "--data", str(bad),
                       "--out", str(tmp_path / "out"))  # fmt: skip
    assert code == 2
    assert err.strip().splitlines() == [
        f'specops: error: {bad}:3: "completion" must be a non-empty string, got 3'
    ]


def test_eagle3_training_is_behind_its_flag(tmp_path):
    env = {"ENABLE_L4_EAGLE3_TRAINING": ""}
    code, _, err = run("heads", "train", "--target", MODEL, "--family", "eagle3", "--data", "x.jsonl",
                       "--out", str(tmp_path), env=env)  # fmt: skip
    assert code == 2
    assert "ENABLE_L4_EAGLE3_TRAINING=1" in err and "Traceback" not in err


@pytest.mark.slow
def test_heads_data_writes_a_disjoint_split(tmp_path):
    from speccore.training.data import check_disjoint, read_examples

    train, held = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    code, _, err = run("heads", "data", "--target", MODEL, "--limit", "60", "--heldout-fraction", "0.2",
                       "--out", str(train), "--heldout-out", str(held))  # fmt: skip
    assert code == 0, err
    n_train, n_held = len(list(read_examples(train))), len(list(read_examples(held)))
    assert n_train > 0 and n_held > 0 and n_train + n_held <= 60
    check_disjoint(train, held)  # raises, naming both lines, if a prompt is on both sides
