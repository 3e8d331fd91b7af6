"""Workload fingerprints: the three-question wizard, `specops fingerprint` on samples files, and
how a run request's `auto` resolves (speccatalog.fingerprint; the gateway's runs logic)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from speccatalog.fingerprint import QUESTIONS, UnknownAnswer, wizard, wizard_table
from specops.cli import main
from specops.commands import fingerprint as command
from specops_schemas.api import RunCreateBody
from specops_schemas.catalog import Fingerprint
from specops_services.gateway.console import fingerprint as console
from specops_services.gateway.runs import logic

CODE_PROMPTS = [
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards.\n'
    '    >>> is_palindrome(\'abba\')\n    True\n    """\n',
    "from typing import List\n\n\ndef mean(values: List[float]) -> float:\n"
    '    """Return the arithmetic mean of values.\n    >>> mean([1.0, 3.0])\n    2.0\n    """\n',
    'def count_vowels(word: str) -> int:\n    """Count the vowels in word.\n'
    '    >>> count_vowels(\'banana\')\n    3\n    """\n',
]
CHAT_MESSAGES = [
    [{"role": "user", "content": "What are some good habits for sleeping better?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "How do I ask my manager for a day off politely?"},
    ],
]


# --- the wizard -----------------------------------------------------------------------------------


def test_the_wizard_covers_every_combination_and_reaches_every_fingerprint() -> None:
    table = wizard_table()
    sizes = [len(q.choices) for q in QUESTIONS]
    assert len(table) == sizes[0] * sizes[1] * sizes[2]
    assert set(table.values()) == {f.value for f in Fingerprint}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (("code", "documents", "long"), "code"),
        (("structured", "conversation", "short"), "structured"),
        (("text", "conversation", "short"), "chat"),
        (("text", "conversation", "long"), "long_context"),
        (("text", "documents", "short"), "rag"),
        (("text", "condense", "long"), "summarization"),
        (("text", "problem", "short"), "reasoning"),
        (("text", "brief", "short"), "creative"),
    ],
)
def test_wizard_answers(answers: tuple[str, str, str], expected: str) -> None:
    assert wizard(*answers) == expected


def test_the_wizard_names_the_choices_of_a_wrong_answer() -> None:
    with pytest.raises(UnknownAnswer, match="output: 'poetry' is not one of text, code, structured"):
        wizard("poetry", "conversation", "short")


def test_the_cli_wizard_asks_three_questions_and_takes_a_number_or_a_value(capsys) -> None:
    replies = iter(["2", "documents", "short"])
    args = command_args(wizard=True, json=True)
    assert command.fingerprint(args, ask=lambda _: next(replies)) == 0
    out = json.loads(capsys.readouterr().out)
    answers = {"output": "code", "input": "documents", "length": "short"}
    assert out == {"fingerprint": "code", "answers": answers}


def test_cli_answers_without_asking(capsys) -> None:
    assert main(["fingerprint", "--answers", "text,condense,long"]) == 0
    assert capsys.readouterr().out.strip() == "fingerprint: summarization"
    assert main(["fingerprint", "--answers", "text,condense"]) == 2
    assert "takes 3 answers, got 2" in capsys.readouterr().err


# --- inference from samples -----------------------------------------------------------------------


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_code_samples_are_inferred_as_code(tmp_path: Path, capsys) -> None:
    samples = write_jsonl(tmp_path / "code.jsonl", [{"prompt": p} for p in CODE_PROMPTS])
    assert main(["fingerprint", "--samples", str(samples), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fingerprint"] == "code" and out["samples"] == 3
    assert out["runner_up"] != "code" and out["confidence"] > out["runner_up_confidence"]
    assert main(["fingerprint", "--samples", str(samples)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fingerprint: code (confidence ") and "runner-up:" in text


def test_messages_read_as_the_same_text_as_prompts(tmp_path: Path, capsys) -> None:
    as_messages = write_jsonl(tmp_path / "m.jsonl", [{"messages": m} for m in CHAT_MESSAGES])
    as_prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": "\n\n".join(t["content"] for t in m)} for m in CHAT_MESSAGES]
    )
    results = []
    for path in (as_messages, as_prompts):
        assert main(["fingerprint", "--samples", str(path), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1] and results[0]["samples"] == 2


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"prompt": "hi"}\nnot json\n', "bad.jsonl:2: not JSON"),
        ('{"text": "hi"}\n', 'bad.jsonl:1: expected {"prompt": "..."} or {"messages"'),
        ('{"messages": [{"role": "user"}]}\n', "bad.jsonl:1: message 0 has no text content"),
        ('{"messages": []}\n', "bad.jsonl:1: a sample's message list is empty"),
        ("\n\n", "holds no sample"),
    ],
)
def test_a_bad_samples_file_is_one_clear_line(tmp_path: Path, capsys, lines: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(lines)
    assert main(["fingerprint", "--samples", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specops fingerprint: error: ") and message in err and err.count("\n") == 1


def test_a_missing_samples_file_is_an_error(tmp_path: Path, capsys) -> None:
    assert main(["fingerprint", "--samples", str(tmp_path / "none.jsonl")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_the_console_answers_pasted_code_as_code() -> None:
    answer = console.inferred("\n\n".join(CODE_PROMPTS))
    assert answer is not None and answer["fingerprint"] == "code"
    assert console.inferred(" \n\n ") is None


# --- a run request's `auto` ----------------------------------------------------------------------

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}


def test_auto_resolves_to_the_inferred_fingerprint_and_drops_the_samples() -> None:
    body = RunCreateBody.model_validate(
        {"target": TARGET, "workload": {"fingerprint": "auto", "samples": CODE_PROMPTS}}
    )
    request = logic.accept(body)
    assert request.workload.fingerprint == Fingerprint.CODE
    inferred = request.workload.inferred
    assert inferred is not None and inferred.samples == 3 and inferred.runner_up != Fingerprint.CODE
    assert "is_palindrome" not in request.model_dump_json()
    plain = logic.accept(RunCreateBody.model_validate({"target": TARGET, "workload": {"fingerprint": "rag"}}))
    assert plain.workload.fingerprint == Fingerprint.RAG and plain.workload.inferred is None


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"fingerprint": "auto", "samples": []}, "at least 1 item"),
        ({"fingerprint": "chat", "samples": ["hi"]}, 'samples are read only with fingerprint "auto"'),
        ({"fingerprint": "auto", "samples": [""]}, "at least 1 character"),
        ({"fingerprint": "auto", "samples": ["x"] * 65}, "at most 64 items"),
    ],
)
def test_auto_without_usable_samples_is_refused(workload: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RunCreateBody.model_validate({"target": TARGET, "workload": workload})


def command_args(**values: object) -> argparse.Namespace:
    defaults = {"samples": None, "wizard": False, "answers": None, "json": False}
    return argparse.Namespace(**{**defaults, **values})
