"""Text of a growing token sequence, delivered as it grows without splitting characters
(`specops generate` prints it, the engine server streams it).

A token can end in the middle of a multi-byte UTF-8 character (byte-level BPE), so a piece
of text is held back until the tokens that complete its character arrive. The `tokenizers`
library's DecodeStream does this in constant work per token: it decodes only a short window
of the latest tokens, never the whole output again (which made a long answer quadratic). The
pieces, joined, are the full decode of the ids with special tokens skipped.
"""

from __future__ import annotations

from typing import Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class Decoder(Protocol):
    """A fast (Rust-backed) Hugging Face tokenizer."""

    @property
    def backend_tokenizer(self) -> Tokenizer: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str: ...


class IncrementalText:
    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []  # kept for the final update of an unfinished character only
        self.given = 0  # characters of the text handed out so far
        self.pending = False  # tokens fed whose text the stream still holds back

    def feed(self, tokens: list[int], *, final: bool = False) -> str:
        """The new text after ``tokens``; on the ``final`` update, all that is left."""
        self.ids.extend(tokens)
        new = self.stream.step(self.backend, tokens) if tokens else None
        if new is None:
            self.pending = self.pending or bool(tokens)
        else:
            self.pending = False
        if final and self.pending:
            # The output ends inside a character: what a full decode makes of it (U+FFFD).
            new = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))[self.given :]
            self.pending = False
        text = new or ""
        self.given += len(text)
        return text
