"""The vLLM flags specops renders, checked by the installed vLLM's own config classes.

`make setup` installs vLLM's CPU build in an environment of its own (specplatform.engines);
these tests run its interpreter. Without that environment they skip, saying how to install it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from speccatalog import engine_args
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Family
from specops_schemas.engine_flags import engine_config
from specplatform import engines

VLLM = engines.state("vllm")
pytestmark = pytest.mark.skipif(
    not VLLM.runnable, reason=f"{VLLM.reason}; `{VLLM.install_command}` (make setup) installs it"
)

FIELDS = """
import dataclasses, json, typing
from vllm.config import SpeculativeConfig
from vllm.config import speculative
print(json.dumps({
    "fields": [f.name for f in dataclasses.fields(SpeculativeConfig)],
    "methods": list(typing.get_args(speculative.SpeculativeMethod)),
}))
"""
# Each rendered --speculative-config, validated the way `vllm serve` validates it at start.
VALIDATE = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
model = sys.argv[1]
out = []
for body in json.loads(sys.stdin.read()):
    try:
        config = EngineArgs(model=model, dtype="float32", speculative_config=body).create_engine_config()
        spec = config.speculative_config
        out.append({"ok": True, "method": spec.method, "k": spec.num_speculative_tokens,
                    "lookup": [spec.prompt_lookup_min, spec.prompt_lookup_max]})
    except Exception as err:
        out.append({"ok": False, "error": f"{type(err).__name__}: {err}"[:400]})
print("RESULT " + json.dumps(out))
"""


def in_vllm(code: str, *args: str, stdin: str = "") -> str:
    assert VLLM.python is not None
    done = subprocess.run(
        [VLLM.python, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_pinned_keys_and_methods_are_the_installed_vllms() -> None:
    found = json.loads(in_vllm(FIELDS).strip().splitlines()[-1])
    assert set(found["fields"]) - engine_args.VLLM_INTERNAL_FIELDS == engine_args.VLLM_KEYS
    assert set(found["methods"]) == engine_args.VLLM_METHODS


def test_every_flag_set_specops_renders_for_a_cpu_run_starts_vllm(smollm2_checkpoint: str) -> None:
    """ngram (every catalog window, and none given), suffix's path and a draft model, rendered
    by apply and validated by vLLM's EngineArgs as `vllm serve` does before it loads."""
    candidates = [
        Candidate(candidate_id="ngram-default", family=Family.NGRAM, k=4),
        *(
            Candidate(
                candidate_id=f"ngram-k{k}-{lo}-{hi}",
                family=Family.NGRAM,
                k=k,
                options={"ngram_min": lo, "ngram_max": hi},
            )
            for k in (2, 5, 8)
            for lo, hi in ((1, 4), (3, 5))
        ),
        Candidate(candidate_id="suffix", family=Family.SUFFIX, k=16),
        Candidate(
            candidate_id="suffix-f2",
            family=Family.SUFFIX,
            k=16,
            options={"suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.05},
        ),
        Candidate(candidate_id="draft", family=Family.DRAFT_MODEL, k=3, draft=smollm2_checkpoint),
    ]
    bodies = [json.loads(engine_config(c, Engine.VLLM)[1][1]) for c in candidates]
    out = in_vllm(VALIDATE, smollm2_checkpoint, stdin=json.dumps(bodies))
    results = json.loads(out.split("RESULT ", 1)[1])
    for candidate, body, result in zip(candidates, bodies, results, strict=True):
        assert result["ok"], (candidate.candidate_id, body, result)
        assert result["k"] == candidate.k
    # What vLLM looks up with is the window speccore measured: its defaults 1..4 when none is given.
    assert results[0]["lookup"] == [1, 4]
    assert [r["lookup"] for r in results[1:7]] == [[1, 4], [3, 5]] * 3


def test_vllm_itself_refuses_the_window_specops_refuses(smollm2_checkpoint: str) -> None:
    """The min > max window apply refuses is one vLLM would stop on at start."""
    body = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 3}
    out = in_vllm(VALIDATE, smollm2_checkpoint, stdin=json.dumps([body]))
    [result] = json.loads(out.split("RESULT ", 1)[1])
    assert not result["ok"] and "prompt_lookup" in result["error"]
