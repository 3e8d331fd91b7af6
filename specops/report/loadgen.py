"""A closed-loop load generator for an OpenAI-compatible server: `concurrency` clients, each
sending its next request as soon as the last one finished, until `n_requests` are done.

Why not guidellm (the vLLM project's load generator): `pip install --dry-run guidellm` (0.8.1)
keeps torch but would add 31 packages (datasets, pyarrow, pandas, sanic, uvloop, ...), and its
multi-process scheduler competes for the same 2 shared cores as the server it measures; what the
report needs — streaming requests at fixed concurrency with per-request TTFT, TPOT and end-to-end
latency — is a few lines over `openai.AsyncOpenAI`, the client the server is tested with.

Per request: TTFT from sending the request to the first streamed content token (so it includes
the server's queue wait), TPOT = (e2e - TTFT) / (output tokens - 1), output tokens from the
stream's usage chunk (`stream_options.include_usage`). Greedy (temperature 0), so every method
decodes the same text and only the speed differs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import openai


@dataclass(frozen=True, slots=True)
class LoadPrompt:
    text: str
    chat: bool  # chat completions (chat template) or plain completions (code stubs)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    start_s: float  # from the start of the level
    ttft_s: float
    e2e_s: float
    output_tokens: int
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class LevelRun:
    concurrency: int
    wall_s: float
    records: list[RequestRecord]


async def run_level(
    base_url: str,
    model: str,
    prompts: list[LoadPrompt],
    *,
    concurrency: int,
    n_requests: int,
    max_tokens: int,
    timeout_s: float = 1800.0,
) -> LevelRun:
    """`n_requests` requests (prompts cycled in order) at a fixed `concurrency`."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=timeout_s, max_retries=0)
    queue: asyncio.Queue[LoadPrompt] = asyncio.Queue()
    for i in range(n_requests):
        queue.put_nowait(prompts[i % len(prompts)])
    records: list[RequestRecord] = []
    t0 = time.perf_counter()

    async def worker() -> None:
        while True:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            records.append(await _one(client, model, prompt, max_tokens, t0))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return LevelRun(concurrency, time.perf_counter() - t0, records)


async def _one(
    client: openai.AsyncOpenAI, model: str, prompt: LoadPrompt, max_tokens: int, t0: float
) -> RequestRecord:
    common = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        if prompt.chat:
            messages = [{"role": "user", "content": prompt.text}]
            stream = await client.chat.completions.create(messages=messages, **common)  # type: ignore[call-overload]
        else:
            stream = await client.completions.create(prompt=prompt.text, **common)  # type: ignore[call-overload]
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if first is None and chunk.choices and _text(chunk.choices[0], prompt.chat):
                first = time.perf_counter()
    except openai.OpenAIError as exc:
        end = time.perf_counter()
        return RequestRecord(start - t0, end - start, end - start, 0, f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    return RequestRecord(start - t0, (first or end) - start, end - start, tokens)


def _text(choice: object, chat: bool) -> str:
    if chat:
        delta = getattr(choice, "delta", None)
        return (getattr(delta, "content", None) or "") if delta is not None else ""
    return getattr(choice, "text", None) or ""
