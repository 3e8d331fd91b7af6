"""Prompt sets on the real data (needs `make setup` to have fetched MT-Bench and MMLU)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from speccatalog.workloads import FINGERPRINTS, WORKLOADS
from speccore.errors import SpecError
from speccore.split import is_heldout
from speccore.training.chunks import chunk_files
from speccore.training.data import read_examples
from specops_schemas.candidates import Sampling
from specops_schemas.catalog import Fingerprint
from specprompts.corpora import CHAT_CONVERSATIONS
from specprompts.derived import (
    DERIVED_WORKLOADS,
    DOCUMENT_SKIP,
    RAG_PASSAGES,
    estimate_tokens,
    long_context_prompts,
    rag_prompts,
)
from specprompts.sets import LONG_CONTEXT_CAP, load_prompts, long_context_budget, prompts_for_model
from specprompts.sources import (
    humaneval_prompts,
    mmlu_questions,
    mtbench_prompts,
    sharegpt_conversations,
    sharegpt_prompts,
)
from specprompts.structured import KINDS as STRUCTURED_KINDS
from specprompts.structured import structured_tasks

PRINT_IDS = (
    "from specprompts.sets import load_prompts; from specprompts.sources import mmlu_questions;"
    "print([p.id for p in load_prompts('chat', 20, seed=3)], [q['id'] for q in mmlu_questions(5, 3)])"
)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_same_seed_gives_same_prompts_in_same_order(workload):
    assert load_prompts(workload, 16, seed=7) == load_prompts(workload, 16, seed=7)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_different_seeds_give_different_prompts(workload):
    a = [p.id for p in load_prompts(workload, 16, seed=0)]
    b = [p.id for p in load_prompts(workload, 16, seed=1)]
    assert a != b


def test_selection_does_not_depend_on_hash_randomization():
    outputs = {
        subprocess.run(
            [sys.executable, "-c", PRINT_IDS],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert len(outputs) == 1


@pytest.mark.parametrize(("workload", "n"), [("chat", 1), ("chat", 37), ("code", 5), ("code", 164)])
def test_n_is_respected_and_ids_are_unique(workload, n):
    prompts = load_prompts(workload, n, seed=2)
    assert len(prompts) == n
    assert len({p.id for p in prompts}) == n


def test_larger_n_extends_smaller_n():
    assert load_prompts("chat", 40, seed=5)[:10] == load_prompts("chat", 10, seed=5)


def test_unknown_workload_lists_valid_ones():
    with pytest.raises(SpecError, match="chat, code"):
        load_prompts("poetry", 4)


@pytest.mark.parametrize("n", [0, -3])
def test_non_positive_n_is_rejected(n):
    with pytest.raises(SpecError, match="positive"):
        load_prompts("chat", n)


def test_asking_for_more_prompts_than_exist_is_an_error():
    with pytest.raises(SpecError, match="164"):
        load_prompts("code", 165)


def test_code_prompts_are_raw_python_function_stubs():
    for prompt in load_prompts("code", 164):
        assert prompt.source == "humaneval"
        assert prompt.id.startswith("humaneval:HumanEval/")
        assert not prompt.chat
        assert "def " in prompt.text
        assert '"""' in prompt.text or "'''" in prompt.text


def test_chat_prompts_are_short_nonempty_chat_messages():
    prompts = load_prompts("chat", 200, seed=4)
    for prompt in prompts:
        assert prompt.chat
        assert prompt.source in ("sharegpt", "mtbench")
        assert prompt.id.startswith(f"{prompt.source}:")
        assert prompt.text.strip()
        assert len(prompt.text) <= 1200 or prompt.source == "mtbench"
    assert {p.source for p in prompts} == {"sharegpt", "mtbench"}


def test_chat_mix_contains_mtbench_questions():
    ids = [p.id for p in load_prompts("chat", 20, seed=0)]
    mtbench = [i for i in ids if i.startswith("mtbench:")]
    assert 3 <= len(mtbench) <= 7
    assert all(81 <= int(i.split(":")[1]) <= 160 for i in mtbench)


def test_chat_never_measures_a_head_on_its_own_training_prompts():
    # The shipped EAGLE head trained on the target's replies to most ShareGPT first turns;
    # chat (and every ShareGPT prompt sent as it is) draws from the held-out share only.
    data = Path(__file__).resolve().parents[2] / "artifacts/heads/smollm2-135m-instruct/distill-256"
    trained = {ex.prompt for path in chunk_files(data)[0] for ex in read_examples(path)}
    chat = [p for p in load_prompts("chat", 120, seed=0) if p.source == "sharegpt"]
    shared = sharegpt_prompts(300, seed=2)
    assert len(chat) > 80 and all(is_heldout(p.text) for p in chat + shared)
    assert not {p.text for p in chat + shared} & trained


def test_sharegpt_filter_drops_non_english_and_translate_button():
    for prompt in sharegpt_prompts(300, seed=9):
        assert 16 <= len(prompt.text) <= 1200
        assert sum(c.isascii() for c in prompt.text) >= 0.95 * len(prompt.text)
        assert not prompt.text.endswith("지금 번역하기")


def test_exclude_ids_skips_exactly_those_prompts():
    full = load_prompts("chat", 30, seed=1)
    excluded = frozenset(p.id for p in full[::3])
    kept = load_prompts("chat", 30, seed=1, exclude_ids=excluded)
    assert len(kept) == 30
    assert not excluded & {p.id for p in kept}
    for source in ("sharegpt", "mtbench"):  # each source keeps its order, minus the excluded
        before = [p for p in full if p.source == source and p.id not in excluded]
        after = [p for p in kept if p.source == source]
        assert after[: len(before)] == before


def test_building_blocks_respect_exclusions():
    first = mtbench_prompts(80)
    assert len({p.id for p in first}) == 80
    with pytest.raises(SpecError, match="MT-Bench has 79"):
        mtbench_prompts(80, exclude_ids=frozenset({first[0].id}))
    code = humaneval_prompts(3, seed=1)
    assert code[0] not in humaneval_prompts(3, seed=1, exclude_ids=frozenset({code[0].id}))


def test_sharegpt_conversations_stream_normalized_turns():
    convs = list(itertools.islice(sharegpt_conversations(), 300))
    assert len({cid for cid, _ in convs}) == 300
    roles = {role for _, turns in convs for role, _ in turns}
    assert roles <= {"user", "assistant", "system"}
    assert "assistant" in roles
    assert all(cid.startswith("sharegpt:") and turns for cid, turns in convs)
    assert len(list(sharegpt_conversations(limit=5))) == 5
    skip = frozenset(cid for cid, _ in convs[:2])
    assert next(sharegpt_conversations(exclude_ids=skip))[0] == convs[2][0]


def test_sharegpt_prompts_are_first_turns_of_their_conversations():
    # Shared ids let training data built from conversations be held out of measurement.
    prompts = {p.id: p.text for p in sharegpt_prompts(50, seed=0)}
    first_turns = {cid: turns[0] for cid, turns in sharegpt_conversations() if cid in prompts}
    assert first_turns.keys() == prompts.keys()
    for conv_id, text in prompts.items():
        role, first_turn = first_turns[conv_id]
        assert role == "user"
        assert first_turn.strip() == text


def test_mmlu_questions_have_four_choices_and_valid_answer():
    questions = mmlu_questions(200, seed=0)
    assert len(questions) == 200
    assert len({q["id"] for q in questions}) == 200
    for q in questions:
        assert len(q["choices"]) == 4
        assert all(isinstance(c, str) for c in q["choices"])
        assert q["answer"] in range(4)
        assert q["question"] != "question"  # the file's stray CSV header rows are dropped
    assert len({q["subject"] for q in questions}) > 20
    assert mmlu_questions(10, seed=0) == questions[:10]
    assert mmlu_questions(10, seed=1) != questions[:10]


def test_missing_fetched_data_says_how_to_fetch_it(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from specprompts.sources import mtbench_prompts; mtbench_prompts(1)"],
        env={**os.environ, "SPECOPS_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "SpecError" in result.stderr
    assert "make setup" in result.stderr


# --- the six derived fingerprints (specprompts.derived, specprompts.structured) --------------

DERIVED = list(DERIVED_WORKLOADS)


def test_there_is_a_prompt_set_for_every_workload():
    assert set(WORKLOADS) == {"chat", "code", *DERIVED, "agentic"}
    assert {spec.fingerprint for spec in WORKLOADS.values()} == set(FINGERPRINTS)


@pytest.mark.parametrize("workload", DERIVED)
def test_derived_sets_give_n_unique_nonempty_chat_prompts(workload):
    prompts = load_prompts(workload, 24, seed=3)
    assert len(prompts) == 24
    assert len({p.id for p in prompts}) == 24
    for prompt in prompts:
        assert prompt.text.strip()
        assert prompt.chat
    assert load_prompts(workload, 8, seed=3) == prompts[:8]


@pytest.mark.parametrize("workload", DERIVED)
def test_derived_sets_respect_exclusions(workload):
    full = load_prompts(workload, 12, seed=1)
    excluded = frozenset(p.id for p in full[::2])
    kept = load_prompts(workload, 12, seed=1, exclude_ids=excluded)
    assert len(kept) == 12
    assert not excluded & {p.id for p in kept}


@pytest.mark.parametrize("workload", ["rag", "summarization", "structured", "reasoning", "long_context"])
def test_a_derived_prompt_is_the_same_text_whatever_the_seed(workload):
    by_id: dict[str, str] = {}
    for seed in range(6):
        for prompt in load_prompts(workload, 60, seed=seed):
            assert by_id.setdefault(prompt.id, prompt.text) == prompt.text


def test_rag_prompts_hold_the_real_answer_among_distractors():
    prompts = {p.id.removeprefix("rag:"): p.text for p in rag_prompts(20, seed=0)}
    first_exchange = {cid: turns[:2] for cid, turns in sharegpt_conversations() if cid in prompts}
    assert first_exchange.keys() == prompts.keys()
    for conv_id, text in prompts.items():
        (_, question), (_, answer) = first_exchange[conv_id]
        assert text.count("[Passage ") == RAG_PASSAGES
        assert answer.strip() in text
        assert text.endswith(f"Question: {question.strip()}")


def test_rag_passages_come_from_conversations_the_chat_rest_corpus_does_not_index():
    assert DOCUMENT_SKIP >= CHAT_CONVERSATIONS
    indexed = {cid for cid, _ in sharegpt_conversations(CHAT_CONVERSATIONS)}
    assert not indexed & {p.id.removeprefix("rag:") for p in rag_prompts(200, seed=0)}


def test_reasoning_alternates_mmlu_and_arithmetic_asked_step_by_step():
    prompts = load_prompts("reasoning", 10, seed=0)
    assert [p.source for p in prompts] == ["mmlu", "generated"] * 5
    assert all("step by step" in p.text for p in prompts)
    assert all("A) " in p.text and "D) " in p.text for p in prompts[::2])


def test_creative_mixes_sources_and_is_sampled_hot():
    prompts = load_prompts("creative", 30, seed=0)
    assert {p.source for p in prompts} == {"mtbench", "sharegpt", "generated"}
    assert Sampling.for_fingerprint(Fingerprint.CREATIVE).temperature >= 0.8
    assert Sampling.for_fingerprint(Fingerprint.CODE).temperature == 0.0  # greedy


def test_long_context_fills_its_budget_without_exceeding_it():
    for budget in (2000, 4000):
        for prompt in long_context_prompts(4, seed=2, max_tokens=budget):
            assert 0.85 * budget <= estimate_tokens(prompt.text) <= budget
            assert prompt.text.count("### Document ") >= 2


def test_long_context_budget_too_small_for_one_document_is_an_error():
    with pytest.raises(SpecError, match="cannot hold even one document"):
        long_context_prompts(1, max_tokens=50)


# structured tasks: the JSON Schemas the quality gate's constraint_violation checks


def test_structured_tasks_cycle_through_kinds_with_valid_schemas():
    tasks = structured_tasks(40, seed=0)
    assert [t.kind for t in tasks[:4]] == list(STRUCTURED_KINDS)
    assert [t.prompt for t in tasks] == load_prompts("structured", 40, seed=0)
    for task in tasks:
        Draft202012Validator.check_schema(task.schema)
        assert json.dumps(task.schema) in task.prompt.text


def _task(kind: str):
    return next(t for t in structured_tasks(8, seed=0) if t.kind == kind)


def _valid(schema, answer) -> bool:
    return Draft202012Validator(schema).is_valid(answer)


def test_tool_call_schema_accepts_a_call_of_an_offered_tool_only():
    schema = _task("tool_call").schema
    offered = [branch["properties"]["name"]["const"] for branch in schema["oneOf"]]
    assert "reply" in offered
    assert _valid(schema, {"name": "reply", "arguments": {"text": "Here is an itinerary."}})
    assert not _valid(schema, {"name": "reply", "arguments": {}})  # missing required argument
    assert not _valid(schema, {"name": "reply", "arguments": {"text": "x", "mood": "happy"}})
    assert not _valid(schema, {"name": "launch_rockets", "arguments": {}})
    if "send_email" in offered:
        email = {"to": "ana@example.com", "subject": "Hi", "body": ""}
        assert _valid(schema, {"name": "send_email", "arguments": email})
        assert not _valid(schema, {"name": "send_email", "arguments": {**email, "to": "not an address"}})


def test_answer_json_schema_wants_a_letter_and_reasoning():
    schema = _task("answer_json").schema
    assert _valid(schema, {"reasoning": "Only B fits the definition.", "answer": "B"})
    assert not _valid(schema, {"reasoning": "Only B fits.", "answer": "E"})
    assert not _valid(schema, {"answer": "B"})
    assert not _valid(schema, "B")


def test_function_spec_schema_pins_the_functions_name_and_parameters():
    task = _task("function_spec")
    name = task.schema["properties"]["name"]["const"]
    params = [
        item["properties"]["name"]["const"] for item in task.schema["properties"]["parameters"]["prefixItems"]
    ]
    assert f"def {name}(" in task.prompt.text
    answer = {
        "name": name,
        "parameters": [{"name": p, "type": "str"} for p in params],
        "returns": "bool",
        "summary": "Checks the input.",
    }
    assert _valid(task.schema, answer)
    assert not _valid(task.schema, {**answer, "name": name + "_v2"})
    assert not _valid(
        task.schema, {**answer, "parameters": answer["parameters"][::-1] + [{"name": "x", "type": "int"}]}
    )
    assert not _valid(task.schema, {**answer, "extra": True})


def test_triage_schema_wants_known_category_and_few_keywords():
    schema = _task("triage").schema
    answer = {
        "category": "writing",
        "difficulty": "easy",
        "needs_code": False,
        "keywords": ["travel", "blog"],
    }
    assert _valid(schema, answer)
    assert not _valid(schema, {**answer, "category": "cooking"})
    assert not _valid(schema, {**answer, "keywords": []})
    assert not _valid(schema, {**answer, "needs_code": "no"})


# sized for a real model


@pytest.mark.slow
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_fingerprint_fits_the_models_context(smollm, workload):
    new = 256
    prompts = prompts_for_model(smollm, workload, 6, max_new_tokens=new, seed=1)
    assert len(prompts) == 6
    sizes = [len(smollm.encode_prompt(p.text, p.chat)) for p in prompts]
    assert all(0 < size <= smollm.max_context - new for size in sizes)
    assert prompts_for_model(smollm, workload, 6, max_new_tokens=new, seed=1) == prompts
    if workload == "long_context":  # near, but under, the context
        budget = long_context_budget(smollm, new)
        assert budget == min(smollm.max_context - new, LONG_CONTEXT_CAP["cpu"])
        assert min(sizes) >= 0.9 * budget


@pytest.mark.slow
def test_long_context_prompts_can_fill_the_whole_context(smollm):
    new = 64
    prompts = prompts_for_model(smollm, "long_context", 2, max_new_tokens=new, long_context_tokens=10**6)
    sizes = [len(smollm.encode_prompt(p.text, p.chat)) for p in prompts]
    # Past the device's cap, up to the context less the new tokens (smollm2: 8192 - 64).
    assert long_context_budget(smollm, new, 10**6) == smollm.max_context - new
    assert all(0.95 * (smollm.max_context - new) <= size <= smollm.max_context - new for size in sizes)


@pytest.mark.slow
def test_a_prompt_too_long_for_the_context_is_refused(smollm):
    with pytest.raises(SpecError, match="exceeds"):
        prompts_for_model(smollm, "rag", 20, max_new_tokens=smollm.max_context - 200)
