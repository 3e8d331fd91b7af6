"""Training data for learned drafts: JSONL, ShareGPT conversion, tokenization, split."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from speccore.errors import SpecError
from speccore.models import chat_prompt_ids, resolve_alias, user_prompt_ids
from speccore.split import is_heldout
from speccore.training.data import (
    Example,
    check_disjoint,
    read_examples,
    self_distill,
    split_jsonl,
    tokenize_example,
    write_examples,
)
from specprompts.examples import sharegpt_examples

GOOD = '{"prompt": "Name a prime.", "completion": "Seven."}'


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    # The smollm2 tokenizer straight from its GGUF file: no weights are loaded.
    gguf = Path(resolve_alias("smollm2-135m-instruct"))
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module")
def sharegpt20() -> list[Example]:
    return sharegpt_examples(20, seed=0)


def test_jsonl_round_trip_skips_blank_lines_and_ignores_unknown_fields(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        "\n".join(
            [
                GOOD,
                "",
                "   ",
                json.dumps({"prompt": "Hi", "completion": "Hello!", "id": "x:1", "score": 0.5}),
                json.dumps({"prompt": "Ça va ?", "completion": "Oui, merci.\nEt toi ?"}),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    examples = list(read_examples(path))
    assert examples == [
        Example("Name a prime.", "Seven."),
        Example("Hi", "Hello!", "x:1"),
        Example("Ça va ?", "Oui, merci.\nEt toi ?"),
    ]
    copy = tmp_path / "copy.jsonl"
    assert write_examples(copy, examples) == 3
    assert list(read_examples(copy)) == examples


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        (b'{"prompt": "a", "completion": ', "not valid JSON"),
        (b'["a", "b"]', 'expected an object with "prompt" and "completion", got list'),
        (b'{"prompt": "a"}', '"completion" is missing'),
        (b'{"completion": "a"}', '"prompt" is missing'),
        (b'{"prompt": "", "completion": "a"}', '"prompt" must be a non-empty string'),
        (b'{"prompt": "a", "completion": "  \\n "}', '"completion" must be a non-empty string'),
        (b'{"prompt": 3, "completion": "a"}', '"prompt" must be a non-empty string, got 3'),
        (b'{"prompt": "a", "completion": null}', '"completion" must be a non-empty string, got null'),
        (b'{"prompt": "a", "completion": "b", "id": 7}', '"id" must be a string when given'),
        (b'{"prompt": "caf\xe9", "completion": "b"}', "not UTF-8 text"),
    ],
)
def test_malformed_line_is_reported_with_file_and_line_number(tmp_path, bad_line, message):
    path = tmp_path / "train.jsonl"
    # Blank lines count: the bad line is line 5 of the file.
    path.write_bytes(b"\n".join([GOOD.encode(), b"", GOOD.encode(), b"", bad_line, GOOD.encode()]) + b"\n")
    with pytest.raises(SpecError) as err:
        list(read_examples(path))
    assert str(err.value).startswith(f"{path}:5: {message}")
    assert "\n" not in str(err.value)


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read training data .*nope.jsonl"):
        list(read_examples(tmp_path / "nope.jsonl"))


def test_sharegpt_conversion_gives_first_exchanges_deterministically(tmp_path, sharegpt20):
    assert len(sharegpt20) == 20
    ids = [ex.id for ex in sharegpt20]
    assert len(set(ids)) == 20
    for ex in sharegpt20:
        assert ex.id is not None and ex.id.startswith("sharegpt:")
        assert ex.prompt.strip() and ex.completion.strip()
        assert ex.prompt != ex.completion

    # Same seed: the same choice; a smaller limit is a prefix; excluded ids are skipped.
    out = tmp_path / "sharegpt.jsonl"
    assert write_examples(out, sharegpt_examples(5, seed=0, exclude_ids=frozenset({ids[0]}))) == 5
    assert list(read_examples(out)) == sharegpt20[1:6]

    other = sharegpt_examples(20, seed=1)
    assert len(other) == 20
    assert {ex.id for ex in other} != set(ids)


def test_bad_sharegpt_limit_is_refused():
    with pytest.raises(SpecError, match="limit must be positive"):
        sharegpt_examples(0)


def test_tokenized_example_masks_exactly_the_completion_and_eos(tokenizer):
    ex = Example("What is the capital of France?", "Paris is the capital of France.")
    tok = tokenize_example(tokenizer, ex, max_len=512)
    assert tok is not None
    n_prompt = tok.loss_mask.count(False)
    completion_ids = tokenizer(ex.completion, add_special_tokens=False).input_ids
    assert tok.loss_mask == [False] * n_prompt + [True] * (len(completion_ids) + 1)
    assert tok.input_ids[n_prompt:] == [*completion_ids, tokenizer.eos_token_id]
    assert tokenizer.decode(tok.input_ids[n_prompt:-1]) == ex.completion

    rendered = tokenizer.decode(tok.input_ids[:n_prompt])
    assert rendered.startswith("<|im_start|>system\n")
    assert rendered.endswith(f"<|im_start|>user\n{ex.prompt}<|im_end|>\n<|im_start|>assistant\n")
    assert tok.input_ids[:n_prompt] == chat_prompt_ids(tokenizer, ex.prompt, "smollm2")


def test_tokenization_truncates_the_completion_and_plain_mode_skips_the_template(tokenizer):
    ex = Example("Count to ten.", "one two three four five six seven eight nine ten")
    n_prompt = len(chat_prompt_ids(tokenizer, ex.prompt, "smollm2"))
    cut = tokenize_example(tokenizer, ex, max_len=n_prompt + 3)
    assert cut is not None
    assert len(cut.input_ids) == n_prompt + 3
    assert cut.loss_mask.count(True) == 3
    assert cut.input_ids[-1] != tokenizer.eos_token_id
    assert tokenize_example(tokenizer, ex, max_len=n_prompt) is None

    plain = tokenize_example(tokenizer, ex, max_len=512, chat=False)
    assert plain is not None
    assert plain.input_ids[: plain.loss_mask.count(False)] == tokenizer(ex.prompt).input_ids

    with pytest.raises(SpecError, match="max_len must be at least 2"):
        tokenize_example(tokenizer, ex, max_len=1)


def test_sharegpt_examples_tokenize_with_a_completion_part(tokenizer, sharegpt20):
    for ex in sharegpt20[:5]:
        tok = tokenize_example(tokenizer, ex, max_len=2048)
        assert tok is not None
        assert len(tok.input_ids) == len(tok.loss_mask) <= 2048
        assert tok.loss_mask[0] is False and tok.loss_mask[-1] is True


def _synthetic(n: int) -> list[Example]:
    return [Example(f"Question {i}: what is {i} squared?", f"{i * i}.") for i in range(n)]


def test_split_is_deterministic_disjoint_and_near_the_fraction(tmp_path):
    examples = _synthetic(400)
    # Duplicates of a prompt, even re-spaced, must land on the same side as the original.
    examples += [Example(f"  Question {i}:  what is {i}\nsquared? ", "again") for i in range(0, 400, 10)]
    src = tmp_path / "all.jsonl"
    write_examples(src, examples)
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"

    n_train, n_heldout = split_jsonl(src, train, heldout, 0.25)
    assert n_train + n_heldout == len(examples)
    assert 0.15 * len(examples) < n_heldout < 0.35 * len(examples)
    first = (train.read_bytes(), heldout.read_bytes())
    split_jsonl(src, train, heldout, 0.25)
    assert (train.read_bytes(), heldout.read_bytes()) == first

    def questions(path: Path) -> set[int]:
        return {int(ex.prompt.split(":")[0].split()[-1]) for ex in read_examples(path)}

    assert questions(train).isdisjoint(questions(heldout))
    assert all(is_heldout(ex.prompt, 0.25) for ex in read_examples(heldout))
    check_disjoint(train, heldout)


def test_overlap_check_catches_a_leaked_prompt(tmp_path):
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    src = tmp_path / "all.jsonl"
    write_examples(src, _synthetic(100))
    split_jsonl(src, train, heldout, 0.3)
    leaked = list(read_examples(heldout))[2]
    kept = list(read_examples(train))
    write_examples(train, [*kept, Example(leaked.prompt + "  ", "a different answer")])
    with pytest.raises(SpecError) as err:
        check_disjoint(train, heldout)
    assert str(err.value) == f"{heldout}:3: prompt is also in the training data at {train}:{len(kept) + 1}"


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_fraction_is_refused(tmp_path, fraction):
    with pytest.raises(SpecError, match="between 0 and 1"):
        is_heldout("a", fraction)
    with pytest.raises(SpecError, match="between 0 and 1"):
        split_jsonl(tmp_path / "none.jsonl", tmp_path / "t.jsonl", tmp_path / "h.jsonl", fraction)
    assert not (tmp_path / "t.jsonl").exists()


def test_self_distillation_replaces_completions_with_the_targets_output(tokenizer):
    # A stand-in for Engine.generate (tested elsewhere): the reply names the prompt length.
    seen: list[list[int]] = []

    def regenerate(batch: list[list[int]]) -> list[list[int]]:
        out = []
        for prompt_ids in batch:
            seen.append(prompt_ids)
            if len(seen) == 2:
                out.append([tokenizer.eos_token_id])
                continue
            text = f"{len(prompt_ids)} tokens in"
            out.append([*tokenizer(text, add_special_tokens=False).input_ids, tokenizer.eos_token_id])
        return out

    source = [
        Example("First?", "old one", "a"),
        Example("Second?", "old two", "b"),
        Example("Third?", "old", "c"),
    ]
    out = list(self_distill(source, tokenizer, regenerate, batch_size=2))
    assert seen == [chat_prompt_ids(tokenizer, ex.prompt, "smollm2") for ex in source]
    # The second reply was empty (only eos): nothing to learn from, so it is dropped.
    assert out == [
        Example("First?", f"{len(seen[0])} tokens in", "a"),
        Example("Third?", f"{len(seen[2])} tokens in", "c"),
    ]


def test_a_base_model_without_chat_template_learns_on_its_plain_prompts(tokenizer):
    # gemma-3-270m's GGUF has no chat template: it is prompted with the text itself, so its
    # self-distilled data and its head's training see the prompts the bench sends it.
    base = copy.deepcopy(tokenizer)
    base.chat_template = None
    ex = Example("Name a prime.", "Seven.")
    tok = tokenize_example(base, ex, max_len=512)
    assert tok is not None
    n_prompt = tok.loss_mask.count(False)
    assert tok.input_ids[:n_prompt] == base(ex.prompt).input_ids
    assert "<|im_start|>" not in base.decode(tok.input_ids)

    seen: list[list[int]] = []

    def regenerate(batch: list[list[int]]) -> list[list[int]]:
        seen.extend(batch)
        return [base("Seven.", add_special_tokens=False).input_ids for _ in batch]

    assert list(self_distill([ex], base, regenerate)) == [ex]
    assert seen == [base(ex.prompt).input_ids]
    # A model with a template keeps it.
    templated = chat_prompt_ids(tokenizer, ex.prompt, "smollm2")
    assert user_prompt_ids(tokenizer, ex.prompt, "smollm2") == templated
