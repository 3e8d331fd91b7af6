"""A family from a separately installed package (tests/plugins/toy_family, found only
through its `specops.families` entry point) is known everywhere a built-in one is: the
CLI's methods, the T1 catalog and its predictions, apply's flags or refusals, and
speccore decodes with it losslessly. No specops file names it.

Each check runs in a subprocess whose PYTHONPATH holds the plugin's directory (with its
dist-info), as an installed package would be, so this test process never sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "plugins" / "toy_family"
SPECOPS = [sys.executable, "-m", "specops.cli"]
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"

PLAN_AND_APPLY = """
import json
from specops_schemas.api import RunCreateRequest
from specops_schemas.catalog import Engine
from specops_schemas.engine_flags import EngineCannotRun, apply_response
from specops_services.predictor.plan import HostInfo, plan_run

def plan(engine):
    request = RunCreateRequest.model_validate({
        "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": engine},
        "workload": {"fingerprint": "code"},
    })
    # A CPU host where vLLM's CPU build is installed (specops engines install vllm).
    host = HostInfo(cuda=False, engines=frozenset({Engine.SPECCORE, Engine.VLLM}))
    return plan_run(request, run_id="r", host=host)

speccore, vllm = plan("speccore"), plan("vllm")
toy = [r for r in speccore.ranked if r.candidate.family == "toy"]
try:
    apply_response("r", toy[0].candidate, "vllm")
    refusal = None
except EngineCannotRun as exc:
    refusal = str(exc)
print(json.dumps({
    "ranked": [r.candidate.candidate_id for r in toy],
    "speedups": [r.prediction.speedup for r in toy],
    "benched": [c.candidate_id for c in speccore.bench_plan.candidates],
    "vllm_pruned": sorted({p.reason for p in vllm.pruned if p.candidate.family == "toy"}),
    "speccore_args": apply_response("r", toy[0].candidate, "speccore").cli_args,
    "vllm_refusal": refusal,
}))
"""


def run(args: list[str], *, plugin: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if plugin:
        env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_cli_offers_the_installed_family_and_only_then() -> None:
    help_text = " ".join(run([*SPECOPS, "generate", "--help"]).stdout.split())
    assert "toy: repeat an earlier token k times" in help_text  # among --method's methods
    assert "toy" not in run([*SPECOPS, "generate", "--help"], plugin=False).stdout


def test_the_catalog_predicts_it_and_apply_renders_or_refuses_it() -> None:
    found = json.loads(run([sys.executable, "-c", PLAN_AND_APPLY]).stdout)
    assert found["ranked"], "the toy family's candidates should survive pruning on speccore"
    assert all(s > 0 for s in found["speedups"])
    assert found["vllm_pruned"] == ["vllm does not implement toy"]
    args = found["speccore_args"]
    assert args[:2] == ["--method", "toy"] and "--k" in args
    assert found["vllm_refusal"] == "vLLM cannot run this candidate: it has no toy method"


@pytest.mark.slow
def test_speccore_decodes_with_it_losslessly() -> None:
    def generate(method: str) -> dict:
        args = [*SPECOPS, "generate", "--model", "smollm2-135m-instruct", "--method", method]
        args += ["--prompt", PROMPT, "--max-new-tokens", "48", "--threads", "2", "--json"]
        return json.loads(run(args).stdout)

    toy, plain = generate("toy"), generate("none")
    assert toy["method"] == "toy"
    assert toy["token_ids"] == plain["token_ids"]
    assert toy["metrics"]["drafted_tokens"] > 0
    assert toy["metrics"]["accepted_tokens"] > 0
