"""The engine server's incremental text on smollm2's tokenizer: however the output's tokens
arrive, the streamed pieces never end inside a character and join to the full decode."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from speccore.detokenize import IncrementalText
from speccore.models import engine_checkpoint

# Emoji (4 bytes, with a skin-tone modifier), CJK, Hangul, accents, code, and special tokens.
TEXT = (
    "Hi 🦊! 東京は日本の首都です。<|im_end|> def f(x):\n    return x ✓ ünïcödé 😀👍🏽 "
    "<|im_start|>한국어 — €12,50 …done"
)


@cache
def _tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(engine_checkpoint("smollm2-135m-instruct"))


def _ids() -> list[int]:
    return list(_tokenizer()(TEXT, add_special_tokens=False).input_ids)


def _stream(ids: list[int], cuts: list[int]) -> list[str]:
    text = IncrementalText(_tokenizer())
    bounds = [0, *sorted(set(cuts)), len(ids)]
    chunks = [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [text.feed(c, final=i == len(chunks) - 1) for i, c in enumerate(chunks)]


def test_the_text_splits_characters_across_tokens() -> None:
    tokenizer = _tokenizer()
    pieces = [tokenizer.decode([i]) for i in _ids()]
    assert any("\ufffd" in p for p in pieces)  # what the test is about
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in _ids()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_streamed_pieces_join_to_the_full_decode(data: st.DataObject) -> None:
    ids = _ids()
    end = data.draw(st.integers(1, len(ids)))  # ending anywhere, mid-character included
    ids = ids[:end]
    cuts = data.draw(st.lists(st.integers(1, max(end - 1, 1)), max_size=end))
    pieces = _stream(ids, cuts)
    assert "".join(pieces) == _tokenizer().decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces[:-1])


def test_one_token_at_a_time_holds_a_split_character_back() -> None:
    tokenizer = _tokenizer()
    fox = list(tokenizer("🦊", add_special_tokens=False).input_ids)
    assert len(fox) > 1
    text = IncrementalText(tokenizer)
    assert [text.feed([i]) for i in fox] == [""] * (len(fox) - 1) + ["🦊"]
    assert text.feed(list(tokenizer("!", add_special_tokens=False).input_ids), final=True) == "!"


def test_a_final_update_inside_a_character_gives_what_a_full_decode_gives() -> None:
    tokenizer = _tokenizer()
    head = list(tokenizer("a", add_special_tokens=False).input_ids)
    tail = list(tokenizer(" 🦊", add_special_tokens=False).input_ids)[:-1]  # the fox unfinished
    text = IncrementalText(tokenizer)
    assert text.feed(head) == "a"
    last = text.feed(tail, final=True)
    assert last.endswith("\ufffd")
    assert "a" + last == tokenizer.decode(head + tail, skip_special_tokens=True)
