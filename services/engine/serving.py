"""The server's state and the asyncio side of a request: OpenAI bodies as checked speccore
requests, handed to the worker; the choices' updates back as text.

A request's updates travel from the worker thread to the event loop through
``loop.call_soon_threadsafe`` into one asyncio.Queue per HTTP request (its n choices, and its
prompts when a completion sends several, share it). Leaving a :class:`ChoiceStream` before
every choice finished (the client went away, the task was cancelled) cancels the rest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from speccore.batching import ContinuousBatcher
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from specops_services.engine import logic
from specops_services.engine.detokenize import Decoder, IncrementalText
from specops_services.engine.drift import DEFAULT_KEY, DriftKey, DriftMonitor, DriftPolicy
from specops_services.engine.drift_events import DriftControl, DriftMetrics, DriftReporter
from specops_services.engine.metrics import EngineMetrics
from specops_services.engine.protocol import ChatCompletionRequest, CompletionRequest
from specops_services.engine.worker import EngineWorker, Event, Failed


class InvalidRequest(Exception):
    """An OpenAI error the client caused: 400 (bad parameters, too long) or 404 (unknown model)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class EngineFailure(Exception):
    """A choice cannot finish: the server is stopping, or a decoding step failed (503)."""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32
    drift: DriftPolicy | None = None  # None: no drift monitor, every request to the one method
    server_id: str | None = None  # drift events' subject id (default: host and port)
    nats_url: str | None = None  # where drift events go; None: logged and counted only
    nats_credentials: Mapping[str, str] = field(default_factory=dict)  # nats.connect options

    @property
    def bus_id(self) -> str:
        return self.server_id or f"{self.host}-{self.port}".replace(".", "-").replace(":", "-")


@dataclass(frozen=True, slots=True)
class Prepared:
    """An HTTP request as speccore requests: choice i is ``requests[i]``."""

    requests: list[Request]
    prompt_tokens: int  # each prompt counted once, whatever n (OpenAI's usage)
    key: DriftKey = DEFAULT_KEY  # the requests' tenant and workload


class EngineServer:
    """What the app's routes share: the target, the worker that owns the batcher, the metrics."""

    def __init__(self, engines: Engine | Mapping[str, Engine], options: ServerOptions) -> None:
        """``engines``: the method served, or with drift control every method of
        ``options.drift.methods`` over one target (the primary first)."""
        self.options = options
        self.batcher = ContinuousBatcher(engines, max_rows=options.max_batch)
        self.target = self.batcher.engine.target
        self.method = self.batcher.engine.method
        self.metrics = EngineMetrics(options.served_model_name)
        self.drift: DriftReporter | None = None
        control = None
        if options.drift is not None:
            missing = set(options.drift.methods) - set(self.batcher.methods)
            if self.method != options.drift.primary or missing:
                need = list(options.drift.methods)
                raise SpecError(f"drift control needs the engines {need}, got {self.batcher.methods}")
            metrics = DriftMetrics(self.metrics.registry, self.model_name, self.batcher.methods)
            self.drift = DriftReporter(
                options.drift, metrics, options.bus_id, options.nats_url, options.nats_credentials
            )
            control = DriftControl(DriftMonitor(options.drift), self.drift)
        self.worker = EngineWorker(self.batcher, self.metrics, control)
        self.created = int(time.time())

    @property
    def model_name(self) -> str:
        return self.options.served_model_name

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise InvalidRequest(404, f"The model `{model}` does not exist.", "model")

    def completion(self, body: CompletionRequest, key: DriftKey = DEFAULT_KEY) -> Prepared:
        self.check_model(body.model)
        return self._prepare(self._completion_prompts(body.prompt), body.max_tokens, body, key)

    def chat(self, body: ChatCompletionRequest, key: DriftKey = DEFAULT_KEY) -> Prepared:
        self.check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = self.target.encode_chat(messages)
        except SpecError as exc:
            raise InvalidRequest(400, str(exc), "messages") from None
        return self._prepare([ids], body.token_limit, body, key)

    def open(self, prepared: Prepared, arrival: float) -> ChoiceStream:
        if not self.worker.alive:
            raise EngineFailure("the engine worker is not running")
        return ChoiceStream(self.worker, prepared.requests, arrival, self.target.tokenizer, prepared.key)

    def _completion_prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """Token ids of each prompt: text as `specops generate` encodes it (no chat template)."""
        if isinstance(prompt, str):
            return [self.target.encode_prompt(prompt, chat=False)]
        ids: list[list[int]] = []
        for p in prompt:
            if isinstance(p, int):  # one prompt given as token ids
                return [[int(t) for t in prompt]]  # type: ignore[arg-type]
            ids.append(self.target.encode_prompt(p, chat=False) if isinstance(p, str) else list(p))
        return ids

    def _prepare(
        self,
        prompts: list[list[int]],
        max_tokens: int | None,
        body: CompletionRequest | ChatCompletionRequest,
        key: DriftKey,
    ) -> Prepared:
        if not prompts:
            raise InvalidRequest(400, "the prompt is empty", "prompt")
        try:
            sampling = logic.sampling_params(body.temperature, body.top_k, body.top_p)
        except SpecError as exc:
            raise InvalidRequest(400, str(exc)) from None
        requests: list[Request] = []
        context = self.target.max_context
        for ids in prompts:
            choices = logic.choice_requests(
                ids,
                n=body.n,
                max_tokens=logic.token_limit(max_tokens, len(ids), context),
                sampling=sampling,
                seed=body.seed,
                stop=body.stop_strings,
            )
            try:
                # check() reads only the request and the model's context, none of the
                # batcher's state, so the event loop may call it beside the worker thread.
                self.batcher.check(choices[0])
            except SpecError as exc:
                raise InvalidRequest(400, f"{exc}; shorten the prompt or lower max_tokens") from None
            requests.extend(choices)
        return Prepared(requests, sum(len(ids) for ids in prompts), key)


class ChoiceStream:
    """The updates of one HTTP request's choices, as (choice index, new text, finish reason)."""

    def __init__(
        self,
        worker: EngineWorker,
        requests: list[Request],
        arrival: float,
        tokenizer: Decoder,
        key: DriftKey = DEFAULT_KEY,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self.worker = worker
        self.n = len(requests)
        self.tickets = [worker.submit(i, r, sink, arrival, key) for i, r in enumerate(requests)]
        self.texts = [IncrementalText(tokenizer) for _ in requests]
        self.completion_tokens = 0
        self._open = set(range(self.n))

    async def updates(self) -> AsyncIterator[tuple[int, str, str | None]]:
        try:
            while self._open:
                event = await self._queue.get()
                if isinstance(event, Failed):
                    raise EngineFailure(event.message)
                self.completion_tokens += len(event.tokens)
                final = event.finish_reason is not None
                new = self.texts[event.index].feed(event.tokens, final=final)
                if final:
                    self._open.discard(event.index)
                yield event.index, new, event.finish_reason
        finally:
            for index in self._open:
                self.worker.cancel(self.tickets[index])

    async def collect(self) -> tuple[list[str], list[str]]:
        """Every choice's whole text and finish reason."""
        texts, reasons = [""] * self.n, ["length"] * self.n
        async for index, new, reason in self.updates():
            texts[index] += new
            if reason is not None:
                reasons[index] = reason
        return texts, reasons
