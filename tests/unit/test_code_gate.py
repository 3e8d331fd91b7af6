"""constraint_violation on code: which completions of a function stub count as parsing, and
the gate's verdict on real decodings.

The rule (specprompts.code): cut at the function's end, the rest must compile; a
completion the token budget cut need only be a valid prefix. The rule's tests hand-build
completions of one HumanEval-like stub for each case. The gate's run on gemma-3-270m, a
base model that completes HumanEval stubs with code (smollm2-135m-instruct mostly answers
them with a Markdown fence and prose, which leaves nothing to break).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from speccore.engine import Engine, Generation, LogitsCallback, Request, TokenCallback
from speccore.sampling import SamplingParams
from specops_schemas.api import Target
from specops_schemas.candidates import Candidate, Measurement, StructuredEvidence
from specops_schemas.catalog import GateMethod
from specops_schemas.events import BenchPlan
from specops_services.quality_gate.constraints import constraint_outcome, constraint_violation
from specops_services.quality_gate.gate import QualityGate
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.sample import GateSample, Thresholds
from specops_services.quality_gate.settings import QualityGateSettings
from specprompts.code import code_tasks, completion_problem, function_end
from specprompts.sets import constraint_tasks, count_replies, load_prompts

STUB = 'def add(a: int, b: int) -> int:\n    """Return a + b.\n    >>> add(1, 2)\n    3\n    """\n'


def problem(completion: str, truncated: bool = False) -> str | None:
    return completion_problem(STUB, completion, truncated=truncated)


@pytest.mark.parametrize(
    "completion",
    [
        "    return a + b\n",
        "    return a + b",  # end of sequence without a final newline
        "    total = a\n    total += b\n    return total\n\n\ndef sub(a, b):\n    return a - b\n",
        # Everything after the function's end is cut, however broken.
        "    return a + b\n\nif __name__ == '__main__':\n    print(add(1 2)\n",
        "    return a + b\n# Example usage: add(1,\n",
        "    return a + b\nprint(add(1, 2)))\n",
        # A stub whose docstring is its whole body: an immediately new function.
        "def other(x):\n    return x (\n",
        '    return int("\\d")  # an invalid escape warns but compiles\n',
    ],
)
def test_finished_completions_that_parse(completion: str) -> None:
    assert problem(completion) is None


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        ("```\n\nThis function adds two numbers.", "completion line 1: invalid syntax"),
        ("    return a +\n", "completion line 1: invalid syntax"),
        ("    return (a + b\n", "'(' was never closed"),
        ("    if a:\n", "expected an indented block"),
        ("    return a + b\n  x = 1\n", "completion line 2: unindent does not match"),
        ('    return a + b\n    """never closed\n', "unterminated triple-quoted string"),
        ("    return a\x00\n", "null bytes"),
    ],
)
def test_finished_completions_that_do_not_parse(completion: str, message: str) -> None:
    found = problem(completion)
    assert found is not None and message in found


@pytest.mark.parametrize(
    "completion",
    [
        "    return (a +\n            b",  # an open bracket the next lines would close
        "    if a > 0:\n        return a + b\n    els",  # the cut line is dropped
        "    return 0x",  # a token cut in two: only the cut line has it
        '    s = """first line\n    second line\n',
        "    for i in range(3):\n",
    ],
)
def test_truncated_completions_are_read_as_a_prefix(completion: str) -> None:
    assert problem(completion, truncated=True) is None


def test_a_truncated_completion_fails_on_a_complete_line_no_continuation_repairs() -> None:
    completion = "    return a + b)\n    x = 1\n    y ="
    found = problem(completion, truncated=True)
    assert found is not None and "completion line 1: unmatched ')'" in found
    # The same prefix cut at the function's end or by the end of sequence is checked whole.
    assert problem("    return (a +\n            b", truncated=False) is not None


def test_function_end_is_a_humaneval_stop_line_at_column_0() -> None:
    assert function_end("    return 1\ndef g():\n") == len("    return 1\n")
    assert function_end("#!\n") == 0
    assert function_end("    if x:\n        print(x)\n") is None  # indented: still the body
    assert function_end("    return 1\n```\n") is None  # a fence is no Python, and counts


def test_code_workload_checks_its_own_stubs_and_agentic_stays_json() -> None:
    tasks = constraint_tasks("code", 3, seed=2)
    assert [t.prompt for t in tasks] == load_prompts("code", 3, seed=2)
    assert tasks == code_tasks(3, seed=2)
    assert {t.check for t in tasks} == {"python_syntax"}
    assert {t.check for t in constraint_tasks("agentic", 2)} == {"json_schema"}
    assert {t.check for t in constraint_tasks("chat", 2)} == {"json_schema"}


def test_violations_per_task_and_per_1k_tokens_against_the_target() -> None:
    tasks = code_tasks(2, seed=0)
    body = "    return None\n"
    counted = count_replies(tasks, [(body, 40), ("```\nprose", 12)], max_new_tokens=64)
    assert [v for v, _ in counted] == [0, 1]
    evidence = StructuredEvidence(
        check="python_syntax",
        task_ids=[t.prompt.id for t in tasks],
        baseline_violations=[0, 0],
        candidate_violations=[v for v, _ in counted],
        candidate_problems=[p for _, p in counted],
        baseline_tokens=500,
        candidate_tokens=500,
    )
    outcome = constraint_outcome(evidence, "greedy", threshold=1.0)
    assert outcome.passed is False
    assert outcome.score == pytest.approx(2.0)  # 1 violation in 500 tokens, the target none
    assert outcome.details["check"] == "python_syntax"
    assert outcome.details["candidate_per_task"] == 0.5
    assert outcome.details["worst_task"] == {
        "task_id": tasks[1].prompt.id,
        "extra_violations": 1,
        "problem": counted[1][1],
    }
    # The target's own failures are not the candidate's.
    same = evidence.model_copy(update={"baseline_violations": [0, 1]})
    assert constraint_outcome(same, "greedy", threshold=1.0).passed is True


# --- on a real model ----------------------------------------------------------------


# Two stubs gemma completes with a real body (a return, a loop), decoded greedily.
CODE_TASKS = [
    t for t in code_tasks(8, seed=0) if t.prompt.id in ("humaneval:HumanEval/27", "humaneval:HumanEval/121")
]
SAMPLE = GateSample(workload="code", batch_size=2, structured_tasks=2, code_new_tokens=48)
NGRAM = Candidate(candidate_id="ngram-k4", family="ngram", k=4)


class NewlineDropping(Engine):
    """A broken candidate: the target's own tokens, but its text loses every newline (a
    detokenizer that drops whitespace-only pieces), so its code runs together."""

    def generate(
        self,
        requests: list[Request],
        on_tokens: TokenCallback | None = None,
        on_logits: LogitsCallback | None = None,
    ) -> list[Generation]:
        found = super().generate(requests, on_tokens, on_logits)
        return [dataclasses.replace(g, text=g.text.replace("\n", "")) for g in found]


@pytest.fixture(scope="module")
def code_gate(gemma) -> QualityGate:
    return QualityGate(gemma, SAMPLE, tasks=CODE_TASKS)


@pytest.mark.slow
def test_a_lossless_candidate_passes_the_code_gate(code_gate) -> None:
    outcome = code_gate.evaluate(GateMethod.CONSTRAINT_VIOLATION, NGRAM)
    assert outcome.passed is True, outcome.details
    assert outcome.score == 0.0
    assert outcome.details["check"] == "python_syntax"
    # The target's own completions parse: the gate had something to break.
    assert outcome.details["baseline_valid_replies"] == outcome.details["candidate_valid_replies"] == 2


@pytest.mark.slow
def test_a_candidate_whose_code_does_not_parse_fails_the_code_gate(code_gate) -> None:
    engine = NewlineDropping(code_gate.reference.target, "none")
    bound = Thresholds().constraint_violation
    outcome = constraint_violation(code_gate.reference, engine, SamplingParams(), bound)
    assert outcome.passed is False, outcome.details
    # One completion the budget cut is all one line now, and a cut line is not checked.
    assert outcome.details["candidate_violations"] > outcome.details["baseline_violations"] == 0
    assert outcome.score is not None and outcome.score > bound
    worst = outcome.details["worst_task"]
    assert isinstance(worst, dict) and "invalid syntax" in str(worst["problem"])
    assert worst["task_id"] in {t.prompt.id for t in CODE_TASKS}


def test_code_evidence_from_an_engine_server_is_judged_and_named(tmp_path: Path) -> None:
    evidence = StructuredEvidence(
        check="python_syntax",
        task_ids=["humaneval:HumanEval/0", "humaneval:HumanEval/1"],
        baseline_violations=[0, 0],
        candidate_violations=[0, 1],
        candidate_problems=[None, "completion line 3: invalid syntax"],
        baseline_tokens=256,
        candidate_tokens=256,
    )
    measured = Measurement(
        candidate_id=NGRAM.candidate_id,
        reps=1,
        tokens_per_s=10.0,
        tokens_per_s_stdev=0.0,
        speedup=1.2,
        acceptance_rate=0.5,
        mean_acceptance_length=2.0,
        per_position_acceptance=[0.5],
        ttft_s=0.1,
        tpot_s=0.05,
        extra_memory_bytes=0,
        structured=evidence,
    )
    plan = BenchPlan(
        run_id="run-code",
        target=Target(model_ref="smollm2-135m-instruct", gpu="cpu", engine="vllm"),
        fingerprint="code",
        mode="interactive",
        quality_gate="constraint_violation",
        candidates=[NGRAM],
        reps=1,
        n_prompts=1,
        max_new_tokens=4,
    )
    runner = GateRunner(QualityGateSettings(measure_lock_dir=tmp_path))
    outcome = runner.evaluate(plan, NGRAM, measured=measured)
    assert outcome.passed is False and outcome.score == pytest.approx(1000 / 256)
    assert outcome.details["measured_over"] == "http" and outcome.details["check"] == "python_syntax"
    assert "code completions that do not parse" in str(outcome.details["reason"])
    assert len(runner.models) == 0  # judged on the bench's evidence, nothing loaded
