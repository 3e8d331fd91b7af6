"""Prompt sets on the real data (needs `make setup` to have fetched MT-Bench and MMLU)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from speccore.errors import SpecError
from speccore.prompts import (
    WORKLOADS,
    humaneval_prompts,
    load_prompts,
    mmlu_questions,
    mtbench_prompts,
    sharegpt_conversations,
    sharegpt_prompts,
)

PRINT_IDS = (
    "from speccore.prompts import load_prompts, mmlu_questions;"
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


def test_sharegpt_filter_drops_non_english_and_translate_button():
    for prompt in sharegpt_prompts(500, seed=9):
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
        [sys.executable, "-c", "from speccore.prompts import mtbench_prompts; mtbench_prompts(1)"],
        env={**os.environ, "SPECOPS_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "SpecError" in result.stderr
    assert "make setup" in result.stderr
