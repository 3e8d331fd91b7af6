"""Text of a growing token sequence, delivered as it grows without splitting characters.

A token can end in the middle of a multi-byte UTF-8 character (byte-level BPE), so the
text of the tokens so far may end in U+FFFD until the next token completes it. Each
update decodes the whole output so far and hands out the part after what was already
given, holding it back while it ends in an incomplete character.
"""

from __future__ import annotations

from typing import Protocol

_INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str: ...


class IncrementalText:
    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.given = 0  # characters of the text handed out so far

    def feed(self, tokens: list[int], *, final: bool = False) -> str:
        """The new text after ``tokens``; on the ``final`` update, all that is left."""
        self.ids.extend(tokens)
        text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        if text.endswith(_INCOMPLETE) and not final:
            return ""
        new = text[self.given :]
        self.given = len(text)
        return new
