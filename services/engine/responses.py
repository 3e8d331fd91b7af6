"""A request's choices as OpenAI bodies: the whole response, or its server-sent events.

Streams are `data: {json}` events ending with `data: [DONE]`, as OpenAI and vLLM send them:
a chat stream opens each choice with the assistant role, then sends content deltas and a
last chunk with the finish reason; a completion stream sends text chunks, its last with the
finish reason. With `stream_options.include_usage` a final chunk carries the usage and no
choices; with `continuous_usage_stats` too, every chunk carries the usage so far (vLLM's).
A choice that cannot finish ends the stream with an `error` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from specops_services.engine.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
    error_response,
)
from specops_services.engine.serving import ChoiceStream, EngineFailure

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Header:
    """What every body and chunk of one response repeats."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, created: int, model: str) -> Header:
        return cls(f"{prefix}-{uuid.uuid4().hex}", created, model)


def usage(prompt_tokens: int, stream: ChoiceStream) -> Usage:
    done = stream.completion_tokens
    cached = stream.cached_tokens
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=done,
        total_tokens=prompt_tokens + done,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached) if cached is not None else None,
    )


async def completion(h: Header, stream: ChoiceStream, prompt_tokens: int) -> CompletionResponse:
    texts, reasons = await stream.collect()
    choices = [
        CompletionChoice(index=i, text=text, finish_reason=reason)
        for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
    ]
    return CompletionResponse(
        id=h.id, created=h.created, model=h.model, choices=choices, usage=usage(prompt_tokens, stream)
    )


async def chat(h: Header, stream: ChoiceStream, prompt_tokens: int) -> ChatCompletionResponse:
    texts, reasons = await stream.collect()
    choices = [
        ChatChoice(index=i, message=AssistantMessage(content=text), finish_reason=reason)
        for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
    ]
    return ChatCompletionResponse(
        id=h.id, created=h.created, model=h.model, choices=choices, usage=usage(prompt_tokens, stream)
    )


async def completion_events(
    h: Header, stream: ChoiceStream, prompt_tokens: int, include_usage: bool, continuous: bool = False
) -> AsyncIterator[str]:
    def chunk(choices: list[CompletionChoice], used: Usage | None = None) -> str:
        if continuous and used is None:
            used = usage(prompt_tokens, stream)
        return _event(
            CompletionResponse(id=h.id, created=h.created, model=h.model, choices=choices, usage=used)
        )

    try:
        async for index, new, reason in stream.updates():
            if new or reason is not None:
                yield chunk([CompletionChoice(index=index, text=new, finish_reason=reason)])
    except EngineFailure as exc:
        yield _error(exc)
    else:
        if include_usage:
            yield chunk([], usage(prompt_tokens, stream))
    yield DONE


async def chat_events(
    h: Header, stream: ChoiceStream, prompt_tokens: int, include_usage: bool, continuous: bool = False
) -> AsyncIterator[str]:
    def chunk(choices: list[ChatChunkChoice], used: Usage | None = None) -> str:
        if continuous and used is None:
            used = usage(prompt_tokens, stream)
        return _event(
            ChatCompletionChunk(id=h.id, created=h.created, model=h.model, choices=choices, usage=used)
        )

    for index in range(stream.n):
        yield chunk([ChatChunkChoice(index=index, delta={"role": "assistant", "content": ""})])
    try:
        async for index, new, reason in stream.updates():
            if new:
                yield chunk([ChatChunkChoice(index=index, delta={"content": new})])
            if reason is not None:
                yield chunk([ChatChunkChoice(index=index, delta={}, finish_reason=reason)])
    except EngineFailure as exc:
        yield _error(exc)
    else:
        if include_usage:
            yield chunk([], usage(prompt_tokens, stream))
    yield DONE


def _event(body: BaseModel) -> str:
    return f"data: {body.model_dump_json()}\n\n"


def _error(exc: EngineFailure) -> str:
    return f"data: {json.dumps(error_response(503, str(exc)))}\n\n"
