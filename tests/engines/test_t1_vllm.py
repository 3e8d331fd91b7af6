"""A T1 run on vLLM's CPU build, measured and gated for real on this host.

The runtime as `specops up` starts it, planning `--gpu cpu --engine vllm`: the
benchmark-runner launches vLLM (the environment `make setup` installs) once for the
baseline and once per candidate, with exactly the flags `apply` renders; the quality
gate's default `topk5` judges each candidate's outputs as the baseline server scored them.
This is also the launch test: every family vLLM's CPU build runs here that the predictor
offers (ngram, suffix) starts from apply's flags and decodes, greedy, the baseline's
own tokens.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from fixtures.runtime import TINY, started

from specops.client import SpeculativeClient
from specops_schemas.candidates import BASELINE_ID
from specops_schemas.catalog import Role
from specops_schemas.events import BenchRepMeasured, GateEvaluated, RunCompleted
from specops_services.gateway.http.tokens import issue_token
from specplatform import engines

VLLM = engines.state("vllm")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
    pytest.mark.skipif(not VLLM.runnable, reason=f"{VLLM.reason}; `{VLLM.install_command}` installs it"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "vllm"}
# Two prompts of 16 tokens; two candidates, the predictor's best of each family vLLM's CPU
# build runs for smollm2 (ngram, suffix): three vLLM starts with the baseline's.
ENV = TINY | {"SPECOPS_BENCH_PROMPTS": "2", "SPECOPS_BENCH_NEW_TOKENS": "16", "SPECOPS_BENCH_CANDIDATES": "2"}


@pytest.mark.timeout(1500)
def test_a_vllm_run_is_measured_gated_and_applied_with_the_flags_it_launched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with started(monkeypatch, env=ENV) as runtime:
        token = asyncio.run(issue_token(runtime.database_url, tenant_id="t1-vllm", role=Role.DEVELOPER))
        with SpeculativeClient(runtime.url, token.secret) as client:
            run = client.runs.create(target=TARGET, workload="code", mode="interactive")
            events = [event.payload for event in client.runs.stream(run.id)]
            assert isinstance(events[-1], RunCompleted), [type(e).__name__ for e in events]
            shown = client.runs.get(run.id)
            applied = client.runs.apply(run.id) if events[-1].winner is not None else None
        assert "starting the vllm server of baseline" in runtime.log("benchmark-runner")

    completed = events[-1]
    reps = [e for e in events if isinstance(e, BenchRepMeasured)]
    gates = [e for e in events if isinstance(e, GateEvaluated)]
    assert completed.measured is True
    families = {c.candidate.family for c in completed.candidates if c.measurement is not None}
    assert {"ngram", "suffix"} <= families, completed.candidates
    assert any(r.candidate_id == BASELINE_ID for r in reps)
    assert any(r.metrics.drafted_tokens > 0 for r in reps if r.candidate_id != BASELINE_ID)

    # The default gate, topk5, judged on the servers' outputs; greedy, each candidate decoded
    # the baseline's own tokens, prompt for prompt.
    assert gates and all(g.method == "topk5" and g.details["measured_over"] == "http" for g in gates)
    assert all(g.passed is True and g.score == 1.0 for g in gates), gates
    server_args = list(engines.VLLM.server_args)
    for row in completed.candidates:
        m = row.measurement
        if m is None:
            continue
        assert m.greedy_agreement == 1.0 and m.top5 is not None and m.top5.tokens > 0
        # Launched with apply's rendering of the candidate, then the shared server settings.
        assert m.launch_args is not None and m.launch_args[-len(server_args) :] == server_args
        assert m.launch_args[0] == "--speculative-config"

    # GET runs/{id} shows what was launched; apply hands out the same flags.
    by_id = {c.candidate.candidate_id: c for c in shown.candidates}
    if applied is not None:
        launched = by_id[applied.candidate_id].measurement
        assert launched is not None and launched.launch_args is not None
        assert launched.launch_args[: len(applied.cli_args)] == applied.cli_args
        print(f"winner {applied.candidate_id}: {applied.cli_args}")
