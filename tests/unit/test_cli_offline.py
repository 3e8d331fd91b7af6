"""The `specops` commands that need no model and no stack: --version, shell completion,
`apply` from a candidate on the command line, vLLM's method names, one `datastores`, and
tables that keep long ids whole."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speccatalog import families
from specops.cli import main
from specops.commands.tables import table
from specops_schemas.catalog import Engine


def specops(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`specops ARGS` in this process: its exit code, stdout and stderr."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's --version, --help and refusals
        code = exit_.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["specops", *args], code, captured.out, captured.err)


def test_version_is_printed(capsys):
    from speccore import __version__

    out = specops(capsys, "--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"specops {__version__}"


def test_importing_the_cli_stays_light():
    heavy = "{'torch', 'pydantic', 'httpx', 'rich'}"
    code = f"import sys, specops.cli; print(sorted({heavy} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_script_names_the_subcommands(shell, capsys):
    out = specops(capsys, "completion", shell)
    assert out.returncode == 0
    for command in ("generate", "bench", "apply", "datastores", "run"):
        assert command in out.stdout
    if shell == "bash":
        assert "complete" in out.stdout


# --- specops apply, offline ----------------------------------------------------------------------


def test_apply_renders_vllms_speculative_config(capsys):
    out = specops(
        capsys, "apply", "--method", "ngram", "--k", "4", "--engine", "vllm", "--model", "Qwen/Qwen3-8B"
    )
    assert out.returncode == 0, out.stderr
    flags, launch = out.stdout.splitlines()
    config = json.loads(flags.split("--speculative-config ", 1)[1].strip("'"))
    assert config["method"] == "ngram" and config["num_speculative_tokens"] == 4
    assert launch.startswith("launch: vllm serve Qwen/Qwen3-8B --speculative-config '{")


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", ["--speculative-config"]),
        ("sglang", ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4"]),
        ("speccore", ["--method", "ngram", "--k", "4"]),
    ],
)
def test_apply_json_for_each_engine(engine, expected, capsys):
    out = specops(
        capsys, "apply", "--method", "ngram", "--k", "4", "--engine", engine, "--model", "M", "--json"
    )
    assert out.returncode == 0, out.stderr
    applied = json.loads(out.stdout)
    assert applied["run_id"] is None and applied["family"] == "ngram"
    assert applied["config"]["engine"] == engine
    args = applied["cli_args"]
    assert all(flag in args for flag in expected)
    launcher = {
        "vllm": ["vllm", "serve", "M"],
        "sglang": ["python", "-m", "sglang.launch_server", "--model-path", "M"],
    }
    assert applied["launch"] == [*launcher.get(engine, ["specops", "serve", "engine", "--model", "M"]), *args]


def test_every_family_on_every_engine_renders_or_says_why(capsys):
    for name, spec in families.families().items():
        for engine in Engine:
            out = specops(
                capsys, "apply", "--method", name, "--engine", engine.value, "--draft", "some/draft", "--json"
            )
            if out.returncode == 0:
                assert json.loads(out.stdout)["config"]["engine"] == engine.value
                assert engine.value in spec.engines, (name, engine)
            else:
                assert out.returncode == 2, (name, engine, out.stderr)
                assert out.stderr.startswith("specops: error: ") and "Traceback" not in out.stderr
                assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_apply_refuses_a_method_the_engine_cannot_run(capsys):
    out = specops(capsys, "apply", "--method", "lookahead", "--engine", "vllm")
    assert out.returncode == 2
    assert out.stderr == "specops: error: vLLM cannot run this candidate: it has no lookahead method\n"


def test_apply_refuses_a_misspelt_option(capsys):
    out = specops(capsys, "apply", "--method", "ngram", "--engine", "vllm", "--option", "prompt_lookup_mix=3")
    assert out.returncode == 2
    assert "unknown option 'prompt_lookup_mix' for ngram" in out.stderr


def test_apply_needs_an_engine_with_a_method(capsys):
    out = specops(capsys, "apply", "--method", "ngram")
    assert out.returncode == 2
    assert "--method needs --engine" in out.stderr


# --- vLLM's method names -------------------------------------------------------------------------


def test_eagle3_is_the_eagle_family_at_version_3(capsys):
    out = specops(capsys, "apply", "--method", "eagle3", "--draft", "heads/e3", "--engine", "vllm", "--json")
    assert out.returncode == 0, out.stderr
    applied = json.loads(out.stdout)
    assert applied["family"] == "eagle"
    config = json.loads(applied["cli_args"][1])
    assert config["method"] == "eagle3" and config["model"] == "heads/e3"


def test_mtp_applies_to_vllm(capsys):
    out = specops(capsys, "apply", "--method", "mtp", "--k", "2", "--engine", "vllm", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(json.loads(out.stdout)["cli_args"][1]) == {"method": "mtp", "num_speculative_tokens": 2}


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve", "engine"]])
def test_mtp_on_speccore_says_why_not(command, capsys):
    out = specops(capsys, *command, "--model", "m", "--method", "mtp")
    assert out.returncode == 2
    assert "speccore does not run mtp yet" in out.stderr
    assert "specops apply --method mtp --engine vllm" in out.stderr
    assert "invalid choice" not in out.stderr


def test_mtp_in_bench_says_why_not(capsys):
    out = specops(capsys, "bench", "--model", "m", "--workload", "code", "--methods", "ngram,mtp")
    assert out.returncode == 2
    assert out.stderr.startswith("specops: error: speccore does not run mtp yet")
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_unknown_method_lists_the_names(capsys):
    out = specops(capsys, "generate", "--model", "m", "--prompt", "hi", "--method", "medusa9")
    assert out.returncode == 2
    assert "invalid choice: 'medusa9'" in out.stderr and "eagle3" in out.stderr


def test_the_aliases_are_in_the_help(capsys):
    out = specops(capsys, "generate", "--help")
    assert "eagle3 = eagle" in " ".join(out.stdout.split())


# --- one datastores command; --json is a flag everywhere ------------------------------------------


def test_datastores_holds_build_and_datastore_is_gone(capsys):
    out = specops(capsys, "datastores", "build", "--help")
    assert out.returncode == 0 and "--corpus" in out.stdout
    gone = specops(capsys, "datastore", "build", "--help")
    assert gone.returncode == 2 and "invalid choice: 'datastore'" in gone.stderr


def test_bench_json_is_a_flag_and_out_takes_the_path(capsys):
    out = specops(capsys, "bench", "--help")
    text = " ".join(out.stdout.split())
    assert "--out OUT" in text and "--json " in text and "--json JSON" not in text


# --- tables ----------------------------------------------------------------------------------------


def test_a_long_candidate_id_stays_whole_and_the_columns_line_up():
    long_id = "eagle-k5-tree4x2x1-" + "x" * 41
    assert len(long_id) == 60
    lines = table(
        ("", "candidate", "k", "gate"),
        [("*", long_id, "5", "topk5 pass"), ("", "ngram-k12", "12", "-")],
        right={"k"},
    ).splitlines()
    assert len(lines) == 3
    assert lines[1] == f"* {long_id}  5 topk5 pass"
    gate = lines[0].index("gate")
    assert lines[1].index("topk5 pass") == gate and lines[2].rindex("-") == gate
    # k is right-aligned: its last digit just before the gate column on every line.
    assert [line[gate - 2] for line in lines] == ["k", "5", "2"]
