"""What the fingerprint classifier sees of one sample prompt: hashed words and a few shapes.

Glossary:

- *text*: one sample prompt as :func:`speccatalog.fingerprint.samples.sample_text` makes it.
- *word features*: lower-cased words, numbers and single punctuation marks, alone and
  as adjacent pairs, each hashed (CRC-32, stable across processes) into one of
  ``HASH_BUCKETS`` slots and weighted 1/sqrt(distinct features) so a long prompt does
  not outvote a short one by its size alone.
- *shape features*: the few numbers no word carries: length (log chars, log lines),
  how much reads like code (indented lines, brackets, operators), digits, question
  marks, and whether the text opens like code or like JSON.
- *window*: all but the length features are read from a text's first and last
  characters only (WINDOW_HEAD and WINDOW_TAIL: the instruction and the question of a
  long prompt), so a 200k-character prompt costs what a 16k one does.

No tokenizer: a model's tokenizer would tie the classifier to one target and to the
engine extra, while these features cost one regex pass and run with the core install.
"""

from __future__ import annotations

import math
import re
import zlib

HASH_BUCKETS = 1 << 13
WINDOW_HEAD = 12_000
WINDOW_TAIL = 4_000
SHAPES = (
    "log_chars",
    "log_lines",
    "indented",
    "brackets",
    "operators",
    "digits",
    "questions",
    "opens_code",
    "opens_json",
    "fenced",
)
# Feature index of each shape, after the hashed buckets.
SHAPE_INDEX = {name: HASH_BUCKETS + i for i, name in enumerate(SHAPES)}
DIMENSIONS = HASH_BUCKETS + len(SHAPES)

_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")
_CODE_START = re.compile(r"\s*(?:def |class |import |from \w+ import|#include|function |const |let |var )")
_JSON_START = re.compile(r"\s*[{\[]")
_BRACKETS = frozenset("{}[]()")
_OPERATORS = frozenset("=<>+-*/%&|;:")
# Log lengths are divided by these so every shape feature stays within about [0, 1].
_LOG_CHARS_SCALE = math.log1p(100_000)
_LOG_LINES_SCALE = math.log1p(2_000)


def features(text: str) -> dict[int, float]:
    """The sparse feature vector of one prompt: index -> value (absent: 0)."""
    window = text
    if len(text) > WINDOW_HEAD + WINDOW_TAIL:
        window = f"{text[:WINDOW_HEAD]}\n{text[-WINDOW_TAIL:]}"
    words = _WORD.findall(window.lower())
    hashed = {_bucket(word) for word in words}
    hashed.update(_bucket(f"{a} {b}") for a, b in zip(words, words[1:], strict=False))
    vector = dict.fromkeys(hashed, 1.0 / math.sqrt(len(hashed))) if hashed else {}
    for name, value in _shapes(text, window).items():
        if value:
            vector[SHAPE_INDEX[name]] = value
    return vector


def _bucket(token: str) -> int:
    return zlib.crc32(token.encode()) % HASH_BUCKETS


def _shapes(text: str, window: str) -> dict[str, float]:
    chars = max(len(window), 1)
    lines = window.split("\n")
    return {
        "log_chars": math.log1p(len(text)) / _LOG_CHARS_SCALE,
        "log_lines": math.log1p(text.count("\n") + 1) / _LOG_LINES_SCALE,
        "indented": sum(line.startswith(("    ", "\t")) for line in lines) / len(lines),
        "brackets": min(1.0, 10 * sum(c in _BRACKETS for c in window) / chars),
        "operators": min(1.0, 10 * sum(c in _OPERATORS for c in window) / chars),
        "digits": min(1.0, 5 * sum(c.isdigit() for c in window) / chars),
        "questions": min(1.0, window.count("?") / 3),
        "opens_code": float(bool(_CODE_START.match(window))),
        "opens_json": float(bool(_JSON_START.match(window))),
        "fenced": float("```" in window),
    }
