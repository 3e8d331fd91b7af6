"""The server's state and the asyncio side of a request: OpenAI bodies as checked speccore
requests, handed to the worker; the choices' updates back as text.

A request's updates travel from the worker thread to the event loop through
``loop.call_soon_threadsafe`` into one asyncio.Queue per HTTP request (its n choices, and its
prompts when a completion sends several, share it), stamped with the loop's clock as they
leave the worker. Leaving a :class:`ChoiceStream` before every choice finished (the client
went away, the task was cancelled) cancels the rest.

Tokenizing runs on the server's one tokenizer thread (``tokenizing``), off the event loop, so
that /health and the other requests' streams go on while a long prompt is encoded; a prompt
over what the context could hold is refused by its length in characters before it is
encoded (logic.prompt_chars_limit).

Security (issue 20), per request from its tenant's policy (security.py): with a draft pool
(`--draft-pool`) its requests draft from and feed their tenant's scope of it (F-S1); with a
pace (F-S2) its choices' tokens are released one per interval (speccore.pacing), streamed
or not: a whole response is sent when its paced stream would have ended; a tenant that
opted out of speculation (F-S3) is decoded plainly (the server keeps a plain engine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from speccore.batching import ContinuousBatcher
from speccore.detokenize import Decoder, IncrementalText
from speccore.draft_pool import DraftPools
from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.pacing import Pacer
from speccore.proposers import NONE as PLAIN
from speccore.sampling import SamplingParams
from specops_schemas.security import PolicySettings, SecurityPolicy
from specops_services.engine import logic
from specops_services.engine.bus import EngineBus
from specops_services.engine.drift import DEFAULT_KEY, DriftKey, DriftMonitor, DriftPolicy
from specops_services.engine.drift_events import DriftControl, DriftMetrics, DriftReporter
from specops_services.engine.live_workload import SummaryPolicy
from specops_services.engine.live_workload_events import LiveWorkloadReporter
from specops_services.engine.metrics import EngineMetrics
from specops_services.engine.protocol import DEFAULT_MAX_BODY_BYTES, ChatCompletionRequest, CompletionRequest
from specops_services.engine.security import SecurityPolicies
from specops_services.engine.security_events import PolicyFeed
from specops_services.engine.tenant_auth import TenantVerifier
from specops_services.engine.worker import EngineWorker, Event, Failed, Tokens


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
    nats_url: str | None = None  # drift events and policy changes; None: logged and counted only
    # ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT: each tenant's live workload summarized; None: off
    live_workload: SummaryPolicy | None = None
    nats_credentials: Mapping[str, str] = field(default_factory=dict)  # nats.connect options
    security: PolicySettings = field(default_factory=PolicySettings)  # every tenant's, unless its own
    policies: tuple[SecurityPolicy, ...] = ()  # tenants' own (`--security-policies`)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a longer body is a 413, unread
    tenant_key: bytes | None = field(default=None, repr=False)  # the trusted proxy's (tenant_auth)

    @property
    def bus_id(self) -> str:
        return self.server_id or f"{self.host}-{self.port}".replace(".", "-").replace(":", "-")


@dataclass(frozen=True, slots=True)
class Prepared:
    """An HTTP request as speccore requests: choice i is ``requests[i]``."""

    requests: list[Request]
    prompt_tokens: int  # each prompt counted once, whatever n (OpenAI's usage)
    key: DriftKey = DEFAULT_KEY  # the requests' tenant and workload
    pace_s: float | None = None  # F-S2: seconds between released tokens; None: as they come
    plain: bool = False  # F-S3: the tenant opted out of speculation


class EngineServer:
    """What the app's routes share: the target, the worker that owns the batcher, the metrics."""

    def __init__(self, engines: Engine | Mapping[str, Engine], options: ServerOptions) -> None:
        """``engines``: the method served, or with drift control every method of
        ``options.drift.methods`` over one target (the primary first). Plain decoding is
        added when it is not among them: an opted-out tenant (F-S3) is decoded with it."""
        self.options = options
        engines = dict(engines) if isinstance(engines, Mapping) else {engines.method: engines}
        if PLAIN not in engines:
            engines[PLAIN] = Engine(next(iter(engines.values())).target, PLAIN)
        self.batcher = ContinuousBatcher(engines, max_rows=options.max_batch)
        self.target = self.batcher.engine.target
        self.method = self.batcher.engine.method
        depth = max((e.config.k for m, e in engines.items() if m != PLAIN), default=0)
        self.metrics = EngineMetrics(options.served_model_name, positions=depth)
        self.bus: EngineBus | None = None
        if options.nats_url is not None and (options.drift is not None or options.live_workload is not None):
            self.bus = EngineBus(options.nats_url, options.bus_id, options.nats_credentials)
        self.drift: DriftReporter | None = None
        control = None
        if options.drift is not None:
            missing = set(options.drift.methods) - set(self.batcher.methods)
            if self.method != options.drift.primary or missing:
                need = list(options.drift.methods)
                raise SpecError(f"drift control needs the engines {need}, got {self.batcher.methods}")
            metrics = DriftMetrics(self.metrics.registry, self.model_name, self.batcher.methods)
            self.drift = DriftReporter(options.drift, metrics, options.bus_id, self.bus)
            control = DriftControl(DriftMonitor(options.drift), self.drift)
        self.worker = EngineWorker(self.batcher, self.metrics, control)
        self.live_workload: LiveWorkloadReporter | None = None
        if options.live_workload is not None:
            self.live_workload = LiveWorkloadReporter(
                options.live_workload, options.bus_id, self.target.ref, self.bus
            )
        self.created = int(time.time())
        self.security = SecurityPolicies(options.security, options.policies)
        self.tenants = TenantVerifier(options.tenant_key)
        # One thread: a burst of long prompts takes one core, not every core from the worker.
        self.tokenizing = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        self.policy_feed: PolicyFeed | None = None
        if options.nats_url is not None:
            self.policy_feed = PolicyFeed(
                self.security, options.nats_url, options.bus_id, options.nats_credentials
            )
        pools = [e.draft_pools for e in self.batcher.engines.values() if e.draft_pools is not None]
        self.draft_pools: DraftPools | None = pools[0] if pools else None
        if self.draft_pools is not None:
            self.metrics.watch_pools(self.draft_pools)
        caches = [e.prefix_cache for e in self.batcher.engines.values() if e.prefix_cache is not None]
        self.prefix_caching = bool(caches)  # usage then tells the prompt tokens it held
        if self.prefix_caching:
            self.metrics.watch_prefix_caches(caches)
        # Requests name a scope when some engine keeps state across requests.
        self.scoped = self.draft_pools is not None or self.prefix_caching

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
        self._check_chars(sum(len(m["content"]) for m in messages), "messages")
        try:
            ids = self.target.encode_chat(messages)
        except SpecError as exc:
            raise InvalidRequest(400, str(exc), "messages") from None
        return self._prepare([ids], body.token_limit, body, key)

    def open(self, prepared: Prepared, arrival: float) -> ChoiceStream:
        if not self.worker.alive:
            raise EngineFailure("the engine worker is not running")
        return ChoiceStream(
            self.worker,
            prepared.requests,
            arrival,
            self.target.tokenizer,
            prepared.key,
            plain=prepared.plain,
            pace_s=prepared.pace_s,
            metrics=self.metrics,
            cached_details=self.prefix_caching,
        )

    def _completion_prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """Token ids of each prompt: text as `specops generate` encodes it (no chat template)."""
        if isinstance(prompt, str):
            self._check_chars(len(prompt), "prompt")
            return [self.target.encode_prompt(prompt, chat=False)]
        if any(isinstance(p, int) for p in prompt):  # one prompt given as token ids
            return [[int(t) for t in prompt]]  # type: ignore[arg-type]
        for p in prompt:
            if isinstance(p, str):
                self._check_chars(len(p), "prompt")
        return [self.target.encode_prompt(p, chat=False) if isinstance(p, str) else list(p) for p in prompt]

    def _check_chars(self, chars: int, param: str) -> None:
        """A 400 for text too long for the context whatever its tokens, before encoding it."""
        context = self.target.max_context
        limit = logic.prompt_chars_limit(context)
        if chars > limit:
            raise InvalidRequest(
                400,
                f"the prompt has {chars} characters, more than a {context}-token context can hold "
                f"(at most {limit}); shorten the prompt",
                param,
            )

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
            sampling = SamplingParams.of(body, min_p=body.min_p)
        except SpecError as exc:
            raise InvalidRequest(400, str(exc)) from None
        vocab = int(self.target.model.config.get_text_config().vocab_size)
        if any(not 0 <= t < vocab for t in body.stop_token_ids or ()):
            raise InvalidRequest(400, f"stop_token_ids must be token ids below {vocab}", "stop_token_ids")
        requests: list[Request] = []
        context = self.target.max_context
        scope = self.security.draft_scope(key.tenant) if self.scoped else None
        for ids in prompts:
            limit = logic.token_limit(max_tokens, len(ids), context)
            if body.min_tokens > limit:
                raise InvalidRequest(
                    400, f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({limit})", "min_tokens"
                )
            choices = logic.choice_requests(
                ids,
                n=body.n,
                max_tokens=limit,
                sampling=sampling,
                seed=body.seed,
                stop=body.stop_strings,
                stop_token_ids=tuple(body.stop_token_ids or ()),
                ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens,
                draft_scope=scope,
            )
            try:
                # check() reads only the request and the model's context, none of the
                # batcher's state, so the tokenizer thread may call it beside the worker's.
                self.batcher.check(choices[0])
            except SpecError as exc:
                raise InvalidRequest(400, f"{exc}; shorten the prompt or lower max_tokens") from None
            requests.extend(choices)
        pace = self.security.pace_s(key.tenant)
        plain = self.security.policy(key.tenant).speculation_opt_out
        return Prepared(requests, sum(len(ids) for ids in prompts), key, pace, plain)


class ChoiceStream:
    """The updates of one HTTP request's choices, as (choice index, new text, finish reason)."""

    def __init__(
        self,
        worker: EngineWorker,
        requests: list[Request],
        arrival: float,
        tokenizer: Decoder,
        key: DriftKey = DEFAULT_KEY,
        *,
        plain: bool = False,
        pace_s: float | None = None,
        metrics: EngineMetrics | None = None,
        cached_details: bool = False,
    ) -> None:
        """``cached_details``: report the prompt tokens the prefix cache held (``cached_tokens``,
        the first choice's: every choice has the one prompt), else None."""
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self.worker = worker
        self.n = len(requests)
        self.tickets = [worker.submit(i, r, sink, arrival, key, plain=plain) for i, r in enumerate(requests)]
        self.texts = [IncrementalText(tokenizer) for _ in requests]
        self.completion_tokens = 0
        self.cached_tokens: int | None = 0 if cached_details else None
        self.pace_s = pace_s
        self.metrics = metrics
        self._open = set(range(self.n))

    async def updates(self) -> AsyncIterator[tuple[int, str, str | None]]:
        source = self._paced(self.pace_s) if self.pace_s is not None else self._as_they_come()
        try:
            async for index, tokens, reason in source:
                self.completion_tokens += len(tokens)
                final = reason is not None
                new = self.texts[index].feed(tokens, final=final)
                if final:
                    self._open.discard(index)
                yield index, new, reason
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

    def _note_cached(self, event: Tokens) -> None:
        if self.cached_tokens is not None and event.index == 0 and event.cached_prompt_tokens is not None:
            self.cached_tokens = event.cached_prompt_tokens

    async def _as_they_come(self) -> AsyncIterator[tuple[int, list[int], str | None]]:
        """The worker's updates (index, tokens, finish reason) as they arrive."""
        ended = 0
        while ended < self.n:
            event = await self._queue.get()
            if isinstance(event, Failed):
                raise EngineFailure(event.message)
            ended += event.finish_reason is not None
            self._note_cached(event)
            yield event.index, event.tokens, event.finish_reason

    async def _paced(self, interval_s: float) -> AsyncIterator[tuple[int, list[int], str | None]]:
        """The worker's updates one token at a time, each when its slot on the choice's paced
        clock comes (speccore.pacing); a failure ends the stream at once."""
        loop = asyncio.get_running_loop()
        pacer = Pacer(interval_s, self.n)
        ended = released = 0
        getter: asyncio.Future[Event] | None = None
        try:
            while ended < self.n or pacer.next_at is not None:
                for r in pacer.due(loop.time()):
                    released += r.token is not None
                    yield r.index, [r.token] if r.token is not None else [], r.finish_reason
                wait = max(pacer.next_at - loop.time(), 0.0) if pacer.next_at is not None else None
                if ended == self.n:
                    await asyncio.sleep(wait or 0.0)
                    continue
                if getter is None:
                    getter = asyncio.ensure_future(self._queue.get())
                done, _ = await asyncio.wait({getter}, timeout=wait)
                if not done:
                    continue
                event = getter.result()
                getter = None
                if isinstance(event, Failed):
                    raise EngineFailure(event.message)
                ended += event.finish_reason is not None
                self._note_cached(event)
                # On the loop's clock when the update is handled, not when the worker made it:
                # the first release anchors the grid, and the loop's delay in taking the
                # worker's update depends on what the worker does next (its draft and verify
                # of the next step), which is the acceptance again.
                pacer.push(event.index, event.tokens, event.finish_reason, loop.time())
        finally:
            if getter is not None:
                getter.cancel()
            if self.metrics is not None:
                self.metrics.paced(released, pacer.slips)
