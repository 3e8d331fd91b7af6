"""Sample requests as users hand them over: a prompt string, or OpenAI-style chat messages.

A *samples file* is JSON Lines, one request a line: ``{"prompt": "..."}`` or
``{"messages": [{"role": "user", "content": "..."}, ...]}``. :func:`sample_text` makes one
text of a request: the messages' contents, blank-line separated, roles left out (a chat
history should read as the conversation it is, not as a transcript to summarise).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class SampleError(ValueError):
    """A sample that is neither a prompt string nor a list of chat messages with text."""


def sample_text(sample: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one sample: the prompt itself, or its messages' contents joined by blank lines."""
    if isinstance(sample, str):
        return sample
    if not isinstance(sample, Sequence):
        raise SampleError("a sample is a prompt string or a list of chat messages")
    parts: list[str] = []
    for i, message in enumerate(sample):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, str):
            raise SampleError(f"message {i} has no text content (a 'content' string)")
        parts.append(content)
    if not parts:
        raise SampleError("a sample's message list is empty")
    return "\n\n".join(parts)


def read_samples(lines: Iterable[str], name: str = "samples") -> list[str]:
    """The texts of a samples file's lines (blank lines skipped); SampleError naming the line."""
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            texts.append(_line_text(json.loads(line)))
        except (json.JSONDecodeError, SampleError) as exc:
            raise SampleError(f"{name}:{number}: {_reason(exc)}") from None
    if not texts:
        raise SampleError(f"{name} holds no sample (one JSON object a line)")
    return texts


def _line_text(record: Any) -> str:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"]
    if isinstance(record, dict) and "messages" in record:
        return sample_text(record["messages"])
    raise SampleError('expected {"prompt": "..."} or {"messages": [{"role": ..., "content": ...}]}')


def _reason(exc: Exception) -> str:
    return f"not JSON ({exc.msg})" if isinstance(exc, json.JSONDecodeError) else str(exc)
