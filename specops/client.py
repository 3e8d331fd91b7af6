"""Python SDK of the T1 HTTP API.

    from specops.client import SpeculativeClient

    with SpeculativeClient() as client:
        run = client.runs.create(
            target={"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            workload={"fingerprint": "chat"},
            mode="interactive",
            goal={"quality_gate": "topk5"},
        )
        for event in client.runs.stream(run.id):
            print(event.type, event.payload)
        winner = client.runs.get(run.id).winner
        flags = client.runs.apply(run.id, engine="vllm").cli_args

        # T2: tune the completed run for 20 minutes, following each trial.
        session = client.tune_sessions.create(run_id=run.id, budget_minutes=20, reps=3)
        for event in client.tune_sessions.stream(session.id):
            print(event.type)
        tuned = client.tune_sessions.get(session.id).winner
        png = client.tune_sessions.curve_png(session.id)

        store = client.datastores.upload("corpus.jsonl", name="our code", fingerprints=["code"])
        # the tenant's later `code` runs offer rest candidates drafting from it (draft = store.id)

Where it connects, first match wins:

- base URL: the `base_url` argument; `SPECOPS_URL`; the gateway of the local runtime
  (`specops up`: `SPECOPS_GATEWAY_HOST` / `SPECOPS_GATEWAY_PORT`, default
  http://127.0.0.1:8787).
- token: the `token` argument; `SPECOPS_TOKEN`; the file `<state dir>/token`
  (`TOKEN_FILE`), which `make demo` writes with `save_token` (mode 0600). Tokens come
  from `specops tokens create`.

Every POST carries an Idempotency-Key (a fresh uuid4 unless given), so the SDK retries
connection errors, 429/502/503/504 and a 409 "key still in flight" with backoff
without ever starting a run twice; a 503 or 429 with `Retry-After` (the gateway's answer
while its database is unreachable) is retried when it says, up to `Retry.max_wait_s`.
Errors the gateway answers are raised as SpecopsAPIError carrying the RFC 9457 problem;
an unreachable gateway as SpecopsConnectionError.
"""

from __future__ import annotations

import builtins
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import stamina
from httpx_sse import EventSource, ServerSentEvent, SSEError, connect_sse
from pydantic import ValidationError

from specbus.envelope import Envelope, EventPayload
from specops_schemas.api import (
    API_PREFIX,
    ApplyRequest,
    ApplyResponse,
    Goal,
    Priorities,
    Problem,
    RunCreateBody,
    RunStatusResponse,
    Target,
    Workload,
    WorkloadRequest,
)
from specops_schemas.catalog import Engine, Family, Fingerprint, Mode, RunStatus
from specops_schemas.events import parse_event
from specops_schemas.heads import (
    HeadDataResponse,
    HeadList,
    HeadResponse,
    HeadTrainRequest,
    HeadTransitionRequest,
)
from specops_schemas.registry import DatastoreList, DatastoreResponse
from specops_schemas.tune import TuneSessionCreateRequest, TuneSessionResponse

URL_ENV = "SPECOPS_URL"
TOKEN_ENV = "SPECOPS_TOKEN"
TOKEN_FILE = "token"

Run: TypeAlias = RunStatusResponse
"""What `runs.create` and `runs.get` return: `.id`, `.status`, `.cache_hit`, `.winner`, `.candidates`."""
TuneSession: TypeAlias = TuneSessionResponse
"""What `tune_sessions.create` and `.get` return: `.id`, `.status`, `.trials`, `.best`, `.winner`."""

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# The gateway sends a keepalive comment every 15 s on an idle stream; a stream silent for
# four of those is dead, and is resumed on a new connection.
STREAM_READ_TIMEOUT_S = 60.0
TERMINAL_EVENT_TYPES = frozenset({"run.completed", "run.failed"})
TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED})
TUNE_TERMINAL_EVENT_TYPES = frozenset({"tune.completed", "tune.failed"})
TUNE_TERMINAL_STATUSES = frozenset({"completed", "failed"})
# A head's stream ends with the head.transitioned into a state no event leaves.
HEAD_FINAL_STATES = frozenset({"rejected", "failed", "deprecated"})
RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
KEY_IN_FLIGHT = "urn:specops:problem:idempotency-key-in-flight"
# The event a stream ends with when it cannot go on; its data is a problem.
SSE_ERROR = "error"

T = TypeVar("T")


# --- errors -----------------------------------------------------------------------------------


class SpecopsError(Exception):
    """Base of the SDK's errors; the message is one line meant for a person."""


class SpecopsAPIError(SpecopsError):
    """The gateway answered with an error: its RFC 9457 problem, and the parts most callers need."""

    def __init__(self, problem: Problem, retry_after: float | None = None) -> None:
        self.problem = problem
        self.status = problem.status
        self.title = problem.title
        self.detail = problem.detail
        self.retry_after = retry_after
        """Seconds the gateway asked to wait before trying again (its `Retry-After`), if it said."""
        super().__init__(
            f"{problem.title} ({problem.status})" + (f": {problem.detail}" if problem.detail else "")
        )

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later: the gateway is overloaded or unavailable
        (429/502/503/504), or our own earlier attempt of this Idempotency-Key is still being
        processed (its 409; the answer comes on retry)."""
        return self.status in RETRY_STATUSES or (self.status == 409 and self.problem.type == KEY_IN_FLIGHT)

    @classmethod
    def from_response(cls, response: httpx.Response) -> SpecopsAPIError:
        retry_after = _retry_after(response)
        try:
            return cls(Problem.model_validate(response.json()), retry_after)
        except (ValueError, ValidationError):
            # Not a problem document (a proxy's HTML page, say): keep what there is.
            text = " ".join(response.text.split())[:200]
            problem = Problem(
                title=response.reason_phrase or "HTTP error", status=response.status_code, detail=text or None
            )
            return cls(problem, retry_after)


class SpecopsConnectionError(SpecopsError):
    """No answer from the gateway (refused, reset, timed out) after the retries."""

    def __init__(self, url: str, cause: BaseException) -> None:
        self.url = url
        self.cause = cause
        super().__init__(f"cannot reach the gateway at {url}: {_describe_transport_error(cause)}")


class RunTimeoutError(SpecopsError, TimeoutError):
    """`runs.wait` gave up before the run reached a terminal status."""


def _describe_transport_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


# --- retries --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retry:
    """When a failed call is tried again (stamina does the waiting).

    A failure is retried `attempts` times in all, about backoff_s * 2**n apart (plus up to
    backoff_s of jitter, at most max_backoff_s). An answer that says when to come back (a 503
    or 429 with `Retry-After`, as the gateway sends while its database is unreachable) is
    retried when it asks, for as long as the call has taken at most `max_wait_s` in all.
    """

    attempts: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    max_wait_s: float = 60.0

    def call(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again on the failures this policy retries; the last one is raised."""
        retrying = stamina.retry(
            on=_RetryBudget(self),
            attempts=None,
            timeout=self.max_wait_s,
            wait_initial=self.backoff_s,
            wait_max=self.max_backoff_s,
            wait_jitter=self.backoff_s,
        )
        return retrying(attempt)()


class _RetryBudget:
    """stamina's backoff hook for one call: whether (and when) to try it again after `exc`."""

    def __init__(self, policy: Retry) -> None:
        self.policy = policy
        self.failures = 0
        self.started = time.monotonic()

    def __call__(self, exc: Exception) -> bool | float:
        if isinstance(exc, SpecopsAPIError):
            if not exc.retryable:
                return False
            retry_after = exc.retry_after
        elif isinstance(exc, httpx.TransportError | _StreamCut):
            retry_after = None
        else:
            return False
        self.failures += 1
        if retry_after is None:
            return self.failures < self.policy.attempts  # True: stamina's jittered backoff
        backoff = min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** (self.failures - 1))
        wait = max(retry_after, backoff)
        return wait if time.monotonic() - self.started + wait <= self.policy.max_wait_s else False


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: the backoff schedule applies


def _retryable(method: str, headers: Mapping[str, str] | None) -> bool:
    """Whether sending the request twice cannot act twice: a safe or idempotent method, or a
    POST with an Idempotency-Key (the gateway answers its repeat from the first)."""
    return method.upper() in IDEMPOTENT_METHODS or any(
        name.lower() == "idempotency-key" for name in (headers or {})
    )


class _StreamCut(SpecopsError):
    """An event stream ended cleanly before its first event while its resource has not ended."""


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run's stream (queued, running, predicted, per-rep, gate, completed ...) or of
    a tune session's (tune.started, tune.trial_completed, ... tune.completed)."""

    id: str
    """Its position in the run's stream; pass it as `last_event_id` to resume after it."""
    type: str
    """Event type, e.g. `run.predicted`, `bench.rep_measured`, `gate.evaluated`, `run.completed`."""
    data: dict[str, Any]
    """The event envelope as JSON."""
    envelope: Envelope[Any] | None
    """The typed envelope; None for an event type this SDK does not know (a newer gateway)."""

    @property
    def payload(self) -> EventPayload | None:
        """The typed payload (e.g. RunPredicted), or None for an unknown event type."""
        return self.envelope.payload if self.envelope is not None else None

    @property
    def terminal(self) -> bool:
        """Whether it ends its stream (a run's or a tune session's answer or failure, a head's
        move to rejected, failed or deprecated)."""
        if self.type == "head.transitioned":
            payload = self.data.get("payload") or {}
            return (payload.get("transition") or {}).get("to_state") in HEAD_FINAL_STATES
        return self.type in TERMINAL_EVENT_TYPES or self.type in TUNE_TERMINAL_EVENT_TYPES

    @classmethod
    def from_sse(cls, message: ServerSentEvent) -> RunEvent:
        if not message.id:
            raise SpecopsError(f"the gateway sent a {message.event} event without an id")
        try:
            data = json.loads(message.data)
        except json.JSONDecodeError:
            raise SpecopsError(f"event {message.id} ({message.event}) is not JSON") from None
        try:
            envelope: Envelope[Any] | None = parse_event(message.data)
        except ValueError:
            envelope = None
        return cls(id=message.id, type=message.event, data=data, envelope=envelope)


# --- the client -----------------------------------------------------------------------------------


def default_url(state_dir: Path | None = None) -> str:
    """`SPECOPS_URL`, else the local runtime's gateway (what `specops up` serves)."""
    explicit = os.environ.get(URL_ENV)
    if explicit:
        return explicit.rstrip("/")
    from specplatform.settings import load_settings

    settings = load_settings(state_dir)
    # A gateway bound to every interface is reached on loopback from this machine.
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(settings.gateway_host, settings.gateway_host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.gateway_port}"


def token_path(state_dir: Path | None = None) -> Path:
    from specplatform.settings import default_state_dir

    return (state_dir if state_dir is not None else default_state_dir()) / TOKEN_FILE


def default_token(state_dir: Path | None = None) -> str | None:
    """`SPECOPS_TOKEN`, else the token saved in the state dir, else None."""
    explicit = os.environ.get(TOKEN_ENV)
    if explicit:
        return explicit.strip()
    try:
        saved = token_path(state_dir).read_text().strip()
    except OSError:
        return None
    return saved or None


def save_token(token: str, state_dir: Path | None = None) -> Path:
    """Store `token` as the default for this machine's clients, readable by this user only."""
    path = token_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token.strip() + "\n")
    os.replace(tmp, path)
    return path


class SpeculativeClient:
    """Synchronous client of the gateway; `runs` holds the T1 operations. Close it, or use `with`."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        retry: Retry | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.base_url = (base_url or default_url(state_dir)).rstrip("/")
        self.token = token if token is not None else default_token(state_dir)
        self.retry = retry or Retry()
        headers = {"Accept": "application/json", "User-Agent": "specops-sdk"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self.runs = Runs(self)
        self.tune_sessions = TuneSessions(self)
        self.datastores = Datastores(self)
        self.heads = Heads(self)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> SpeculativeClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        retryable: bool | None = None,
    ) -> httpx.Response:
        """One call with retries (`retry`); the successful response, or SpecopsAPIError /
        SpecopsConnectionError.

        Only requests that cannot act twice are retried: safe and idempotent methods, and
        POSTs that carry an Idempotency-Key (which the SDK's own POSTs always do).
        """
        if retryable is None:
            retryable = _retryable(method, headers)

        def attempt() -> httpx.Response:
            response = self.http.request(
                method, path, json=json_body, content=content, params=params, headers=headers
            )
            if not response.is_success:
                raise SpecopsAPIError.from_response(response)
            return response

        try:
            return self.retry.call(attempt) if retryable else attempt()
        except httpx.TransportError as exc:
            raise SpecopsConnectionError(self.base_url, exc) from exc


class Runs:
    """T1 runs: `POST runs`, `GET runs/{id}`, `GET runs/{id}/events`, `POST runs/{id}/apply`."""

    def __init__(self, client: SpeculativeClient) -> None:
        self._client = client

    def create(
        self,
        target: Target | Mapping[str, Any],
        workload: WorkloadRequest | Workload | Mapping[str, Any] | str,
        mode: Mode | str = Mode.INTERACTIVE,
        goal: Goal | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Start a T1 run (`workload` may be just the fingerprint, e.g. "chat", a run's own
        `request.workload` (asking again with the fingerprint it ran with), or
        `{"fingerprint": "auto", "samples": [...]}` for the gateway to infer it; `"auto"` alone
        infers it from the endpoint's live traffic where ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT is on).

        The answer is `queued`, or already `completed` with `cache_hit=True` when the
        30-day winner cache has this request. Invalid arguments raise pydantic's
        ValidationError before anything is sent.
        """
        if isinstance(workload, str):
            workload = {"fingerprint": workload}
        elif isinstance(workload, Workload):  # a run's own request: the fingerprint it ran with
            workload = {"fingerprint": workload.fingerprint}
        fields: dict[str, Any] = {"target": target, "workload": workload, "mode": mode}
        if goal is not None:
            fields["goal"] = goal
        body = RunCreateBody.model_validate(fields).model_dump(mode="json", exclude_none=True)
        response = _post_keyed(self._client, f"{API_PREFIX}/runs", body, idempotency_key)
        return Run.model_validate(response.json())

    def get(self, run_id: str) -> Run:
        """The run's status; once completed, its `winner`, `candidates`, `cache_hit` and `measured`."""
        return Run.model_validate(self._client.request("GET", _run_path(run_id)).json())

    def stream(self, run_id: str, last_event_id: str | int | None = None) -> Iterator[RunEvent]:
        """The run's events from the start (or after `last_event_id`) until `run.completed`/`run.failed`.

        A dropped or stalled connection is resumed with `Last-Event-ID`, so no event is
        lost or repeated; SpecopsConnectionError once the reconnections in a row allowed by
        `retry` brought nothing. Resumed after the terminal event, it yields nothing. A token
        revoked while the stream is open ends it with SpecopsAPIError (401).
        """
        return _follow(
            self._client,
            _run_path(run_id),
            last_event_id,
            lambda: self.get(run_id).status in TERMINAL_STATUSES,
        )

    def wait(self, run_id: str, timeout: float | None = None, *, poll_s: float = 0.5) -> Run:
        """Poll until the run is completed or failed; RunTimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if run.status in TERMINAL_STATUSES:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeoutError(f"run {run_id} is still {run.status.value} after {timeout:g} s")
            pause = poll_s if deadline is None else min(poll_s, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)

    def apply(
        self,
        run_id: str,
        engine: Engine | str | None = None,
        candidate_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ApplyResponse:
        """Engine flags for the winner (or `candidate_id`), for the run's engine or `engine`."""
        return _apply(self._client, _run_path(run_id), engine, candidate_id, idempotency_key)


class TuneSessions:
    """T2 tune sessions: `POST tune-sessions`, `GET tune-sessions/{id}[/events|/curve.png]`,
    `POST tune-sessions/{id}/apply`."""

    def __init__(self, client: SpeculativeClient) -> None:
        self._client = client

    def create(
        self,
        run_id: str,
        budget_minutes: float | None = None,
        reps: int | None = None,
        priorities: Priorities | Mapping[str, float] | None = None,
        families: Iterable[Family | str] | None = None,
        max_trials: int | None = None,
        seed: int | None = None,
        idempotency_key: str | None = None,
    ) -> TuneSession:
        """Tune a completed, measured T1 run within `budget_minutes` of wall clock (default 60).

        The answer is `queued`; follow it with `stream`. Invalid arguments raise pydantic's
        ValidationError before anything is sent; an unknown run a 404, a run not completed
        or not measured here a 409 (SpecopsAPIError).
        """
        given = {
            "run_id": run_id,
            "budget_minutes": budget_minutes,
            "reps": reps,
            "priorities": priorities,
            "families": list(families) if families is not None else None,
            "max_trials": max_trials,
            "seed": seed,
        }
        request = TuneSessionCreateRequest.model_validate({k: v for k, v in given.items() if v is not None})
        body = request.model_dump(mode="json", exclude_none=True)
        response = _post_keyed(self._client, f"{API_PREFIX}/tune-sessions", body, idempotency_key)
        return TuneSession.model_validate(response.json())

    def get(self, session_id: str) -> TuneSession:
        """The session: status, trials (mean ± sigma), best so far, curve, dropped dimensions, winner."""
        return TuneSession.model_validate(self._client.request("GET", _session_path(session_id)).json())

    def stream(self, session_id: str, last_event_id: str | int | None = None) -> Iterator[RunEvent]:
        """The session's events from the start (or after `last_event_id`) until `tune.completed` /
        `tune.failed`; resumed across dropped connections exactly as `runs.stream`."""
        return _follow(
            self._client,
            _session_path(session_id),
            last_event_id,
            lambda: self.get(session_id).status in TUNE_TERMINAL_STATUSES,
        )

    def curve_png(self, session_id: str) -> bytes:
        """The best-so-far curve as PNG bytes; SpecopsAPIError (404) until a trial has ended."""
        return self._client.request("GET", f"{_session_path(session_id)}/curve.png").content

    def apply(
        self,
        session_id: str,
        engine: Engine | str | None = None,
        candidate_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ApplyResponse:
        """Engine flags for the session's winner (or a complete trial's `candidate_id`)."""
        return _apply(self._client, _session_path(session_id), engine, candidate_id, idempotency_key)


def _post_keyed(
    client: SpeculativeClient, path: str, body: Any, idempotency_key: str | None
) -> httpx.Response:
    """POST `body` under `idempotency_key` (a fresh uuid4 unless given), so its retries cannot act twice."""
    key = idempotency_key or str(uuid.uuid4())
    return client.request("POST", path, json_body=body, headers={"Idempotency-Key": _sf_string(key)})


def _apply(
    client: SpeculativeClient,
    resource: str,
    engine: Engine | str | None,
    candidate_id: str | None,
    idempotency_key: str | None,
) -> ApplyResponse:
    """`POST {resource}/apply`: a run's or a session's winner (or `candidate_id`) as engine flags."""
    body = ApplyRequest.model_validate({"engine": engine, "candidate_id": candidate_id})
    response = _post_keyed(client, f"{resource}/apply", body.model_dump(mode="json"), idempotency_key)
    return ApplyResponse.model_validate(response.json())


def _follow(
    client: SpeculativeClient, path: str, last_event_id: str | int | None, ended: Callable[[], bool]
) -> Iterator[RunEvent]:
    """The events of `path`/events until a terminal one, resumed across dropped connections.

    Each connection is retried (`client.retry`) until it brings a first event; a connection
    cut after some events is resumed after the last one with a fresh retry budget. `ended()`
    says whether the run or session has ended: a clean, empty stream then means there is
    nothing left to send.
    """
    last = None if last_event_id is None else str(last_event_id)
    while True:
        with ExitStack() as connection:
            try:
                events = client.retry.call(partial(_connect, client, connection, path, last, ended))
            except httpx.TransportError as exc:
                raise SpecopsConnectionError(client.base_url, exc) from exc
            if events is None:
                return
            try:
                for event in events:
                    last = event.id
                    yield event
                    if event.terminal:
                        return
            except httpx.TransportError:
                pass  # cut after some events: resumed after `last`


def _connect(
    client: SpeculativeClient, connection: ExitStack, path: str, last: str | None, ended: Callable[[], bool]
) -> Iterator[RunEvent] | None:
    """One connection to `path`/events (after event `last`), held open by `connection`: its
    events from the first one, or None when it has none and the resource has ended."""
    headers = {} if last is None else {"Last-Event-ID": last}
    timeout = httpx.Timeout(client.http.timeout.connect or 5.0, read=STREAM_READ_TIMEOUT_S)
    with ExitStack() as attempt:
        source = attempt.enter_context(
            connect_sse(client.http, "GET", f"{path}/events", headers=headers, timeout=timeout)
        )
        if not source.response.is_success:
            source.response.read()
            raise SpecopsAPIError.from_response(source.response)
        events = _events(source, path)
        first = next(events, None)
        if first is None:
            # A clean, empty end: resumed after the terminal event (nothing is left to send),
            # or cut by something between us and the gateway; the resource's status tells which.
            if ended():
                return None
            raise _StreamCut(f"the event stream of {path} keeps ending before its run or session does")
        connection.enter_context(attempt.pop_all())
        return itertools.chain([first], events)


def _events(source: EventSource, path: str) -> Iterator[RunEvent]:
    try:
        for message in source.iter_sse():
            if not message.data:
                continue  # no data, no event (WHATWG HTML §9.2.6): a keepalive's blank line
            if message.event == SSE_ERROR:
                raise _stream_error(message.data)
            yield RunEvent.from_sse(message)
    except SSEError:
        media = source.response.headers.get("content-type", "nothing")
        raise SpecopsError(f"{path}/events answered {media}, not an event stream") from None


# Media types of an upload, by the corpus file's suffix (anything else is sent as text).
JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})


class Datastores:
    """Customer corpora for the rest family: `POST datastores`, `GET datastores[/{id}]`."""

    def __init__(self, client: SpeculativeClient) -> None:
        self._client = client

    def upload(
        self,
        corpus: str | Path | bytes,
        *,
        name: str | None = None,
        fingerprints: Iterable[Fingerprint | str] = (),
        jsonl: bool | None = None,
    ) -> DatastoreResponse:
        """Upload a corpus: a file path (`.jsonl` / `.ndjson`: one record a line with `"text"`,
        or `"prompt"` + `"completion"`; anything else: one text document) or its bytes.

        `name` defaults to the file's name; `jsonl` overrides what the suffix says (bytes are
        text unless it is True). Uploading the same bytes again returns the same datastore.
        Content-addressed, so a retried upload cannot register it twice.
        """
        if isinstance(corpus, bytes):
            data, suffix = corpus, ""
        else:
            path = Path(corpus)
            data, suffix = path.read_bytes(), path.suffix.lower()
            name = name or path.name
        if not name:
            raise ValueError("name the corpus: upload(..., name=...)")
        is_jsonl = jsonl if jsonl is not None else suffix in JSONL_SUFFIXES
        params = {"name": name}
        workloads = [Fingerprint(f) for f in fingerprints]
        if workloads:
            params["fingerprints"] = ",".join(workloads)
        media = "application/jsonl" if is_jsonl else "text/plain; charset=utf-8"
        response = self._client.request(
            "POST",
            f"{API_PREFIX}/datastores",
            content=data,
            params=params,
            headers={"Content-Type": media},
            retryable=True,
        )
        return DatastoreResponse.model_validate(response.json())

    def list(self) -> builtins.list[DatastoreResponse]:
        """The tenant's datastores, newest first."""
        response = self._client.request("GET", f"{API_PREFIX}/datastores")
        return DatastoreList.model_validate(response.json()).datastores

    def get(self, datastore_id: str) -> DatastoreResponse:
        path = f"{API_PREFIX}/datastores/{quote(datastore_id, safe='')}"
        return DatastoreResponse.model_validate(self._client.request("GET", path).json())


class Heads:
    """The T3 head registry: `POST heads/data`, `POST heads/train`, `GET heads[/{id}[/events]]`,
    `POST heads/{id}/transition`."""

    def __init__(self, client: SpeculativeClient) -> None:
        self._client = client

    def upload(self, data: str | Path | bytes) -> HeadDataResponse:
        """Upload a JSONL of `{"prompt", "completion"}` lines (a path or its bytes); reference it in
        `submit` by the answer's `sha256`. Content-addressed: the same bytes again are the same upload."""
        body = data if isinstance(data, bytes) else Path(data).read_bytes()
        response = self._client.request(
            "POST",
            f"{API_PREFIX}/heads/data",
            content=body,
            headers={"Content-Type": "application/jsonl"},
            retryable=True,
        )
        return HeadDataResponse.model_validate(response.json())

    def submit(
        self, request: HeadTrainRequest | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> HeadResponse:
        """Train a head: a HeadTrainRequest, or its fields (`target`, `family`, `train_data`, ...).
        The answer is `training`; follow it with `stream` or `get`."""
        body = request if request is not None else HeadTrainRequest.model_validate(fields)
        response = _post_keyed(
            self._client,
            f"{API_PREFIX}/heads/train",
            body.model_dump(mode="json", exclude_none=True),
            idempotency_key,
        )
        return HeadResponse.model_validate(response.json())

    def list(self) -> builtins.list[HeadResponse]:
        """The tenant's heads, newest first."""
        return HeadList.model_validate(self._client.request("GET", f"{API_PREFIX}/heads").json()).heads

    def get(self, head_id: str) -> HeadResponse:
        return HeadResponse.model_validate(self._client.request("GET", _head_path(head_id)).json())

    def transition(
        self, head_id: str, to: str, rationale: str | None = None, *, idempotency_key: str | None = None
    ) -> HeadResponse:
        """Move the head to `uat`, `production` (admin or head_reviewer, with a rationale) or
        `deprecated` (with a rationale); SpecopsAPIError 409 / 403 / 422 when it may not."""
        body = HeadTransitionRequest.model_validate({"to": to, "rationale": rationale})
        response = _post_keyed(
            self._client,
            f"{_head_path(head_id)}/transition",
            body.model_dump(mode="json", exclude_none=True),
            idempotency_key,
        )
        return HeadResponse.model_validate(response.json())

    def stream(self, head_id: str, last_event_id: str | int | None = None) -> Iterator[RunEvent]:
        """The head's events from the start (or after `last_event_id`) until it is rejected, failed
        or deprecated; resumed across dropped connections exactly as `runs.stream`."""
        return _follow(
            self._client,
            _head_path(head_id),
            last_event_id,
            lambda: self.get(head_id).state in HEAD_FINAL_STATES,
        )


def _stream_error(data: str) -> SpecopsAPIError:
    """The problem an event stream ended with (its token was revoked, say)."""
    try:
        return SpecopsAPIError(Problem.model_validate_json(data))
    except ValidationError:
        text = " ".join(data.split())[:200]
        return SpecopsAPIError(Problem(title="Event stream error", status=500, detail=text or None))


def _run_path(run_id: str) -> str:
    # Run ids are subject tokens; anything else is quoted whole, and the gateway answers 404.
    return f"{API_PREFIX}/runs/{quote(run_id, safe='')}"


def _session_path(session_id: str) -> str:
    return f"{API_PREFIX}/tune-sessions/{quote(session_id, safe='')}"


def _head_path(head_id: str) -> str:
    return f"{API_PREFIX}/heads/{quote(head_id, safe='')}"


def _sf_string(key: str) -> str:
    """The key as an RFC 8941 structured-field string, which the Idempotency-Key header is."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
