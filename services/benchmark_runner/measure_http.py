"""Measure a bench plan on OpenAI-compatible engine servers: vLLM, SGLang or `specops serve engine`.

The HTTP source of the measuring protocol (protocol.py: warm-up, interleaved reps,
speedups as same-rep ratios to the baseline, a failing candidate dropped alone, the same
rows and summaries), so a bench over HTTP is published, stored and gated like one
in-process. What differs:

- Each method decodes on a server of its own (engine_server.py): the baseline on the
  engine without speculation, each candidate with its rendered flags. Every server is
  started once per bench, before the warm-up, and stopped when the bench ends, fails or
  is cancelled. A candidate whose server does not start fails alone (error_stage
  model_load; validation where the engine refuses its flags); a baseline that does not
  start fails the bench.
- Prompts are the plan's workload prompts (specprompts.sets.load_prompts, as
  in-process) sent as text: chat prompts to /v1/chat/completions (the server applies
  the model's chat template), raw ones to /v1/completions; `max_tokens`, temperature,
  top_p, top_k and seed (prompt i: seed + i) as in-process. A batch's requests are sent
  concurrently (batch mode: 8 at once; interactive: one). The protocol's prompt token
  lists stand for prompt indices here.
- Per request, streamed: TTFT, total time, and the prompt and new tokens from the
  stream's `usage`. Acceptance comes from the server's Prometheus spec-decode counters,
  scraped before and after each batch (engine_metrics.py, their time left out of the
  method's); a batch's counts are booked on its first request's metrics, so a rep's
  sums are the server's.
- After the reps, the servers gather the evidence of the plan's gate method, which the
  quality gate judges (it cannot decode on an engine it does not run): for `exact`,
  every candidate's greedy texts against the baseline's (`Measurement.greedy_agreement`);
  for `topk5` on vLLM, every candidate's outputs scored by the baseline server
  (`Measurement.top5`, gate_http), and, when the plan is greedy, their tokens against
  the baseline's; on vLLM and SGLang, for `mmlu_slice` every server's answers to the
  seeded MMLU questions (`Measurement.mmlu`), for `constraint_violation` every server's
  replies to the workload's JSON-Schema tasks, or its completions of the code tasks, their
  violations counted (`Measurement.structured`). `logit_kl` has none: it needs each token's whole
  distribution, which a server does not return, so its gate fails closed.
- Each method's launch flags after the model (`apply`'s, then the shared server
  settings) are kept with its summary (`Measurement.launch_args`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai

from speccatalog.artifacts import is_head_id
from speccore.bench import Decoded, Method, Schedule, describe
from speccore.engine import Request
from speccore.errors import SpecError
from speccore.metrics import GenerationMetrics
from speccore.models import engine_checkpoint
from speccore.sampling import SamplingParams
from specops_schemas.candidates import BASELINE_ID, Candidate, MmluEvidence, StructuredEvidence
from specops_schemas.catalog import Engine, ErrorStage, GateMethod
from specops_schemas.engine_flags import EngineCannotRun
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner import engine_metrics, gate_http
from specops_services.benchmark_runner.engine_server import (
    HOST,
    EngineServer,
    EngineStartError,
    HttpEngine,
    ServerSpec,
    free_port,
    launch_args,
    server_command,
)
from specops_services.benchmark_runner.measure import Corpora, registry_head
from specops_services.benchmark_runner.protocol import (
    BenchOutcome,
    CandidateFailed,
    Fields,
    MeasureError,
    RepCallback,
    RepRow,
    run,
    schedule,
)
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specprompts.code import CodeTask
from specprompts.mmlu import ANSWER_PREFIX, parse_answer, question_text
from specprompts.sets import constraint_tasks, count_replies, load_prompts
from specprompts.sources import Prompt, mmlu_questions

log = logging.getLogger(__name__)
_T = TypeVar("_T")

GREEDY = SamplingParams()
# What the gate's evidence decodes on the servers: the in-process gate's default sample
# (quality_gate.sample.GateSample): prompts of topk5, MMLU questions and the tokens of their
# answers, constraint tasks and the tokens of their JSON replies or code completions.
GATE_PROMPTS = 4
MMLU_QUESTIONS = 20
MMLU_NEW_TOKENS = 4
STRUCTURED_TASKS = 4
STRUCTURED_NEW_TOKENS = 96
CODE_NEW_TOKENS = 128


def http_engine(plan: BenchPlan, settings: BenchmarkRunnerSettings) -> HttpEngine | None:
    """The server a plan is measured on; None: in-process speccore."""
    engine = plan.target.engine
    if engine == Engine.VLLM:
        return HttpEngine.VLLM
    if engine == Engine.SGLANG:
        return HttpEngine.SGLANG
    return HttpEngine.SPECOPS if settings.bench_speccore == "server" else None


@dataclass(frozen=True, slots=True)
class Generated:
    """One request's answer: its text and what was measured of it."""

    text: str
    metrics: GenerationMetrics


@dataclass(slots=True)
class HttpMethod:
    """One bench method on its server: a speccore.bench Method, and a greedy decoder."""

    engine: HttpEngine
    server: EngineServer
    prompts: Sequence[Prompt]
    timeout_s: float
    client: openai.OpenAI = field(init=False)
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(
            base_url=f"{self.server.url}/v1", api_key="unused", timeout=self.timeout_s, max_retries=0
        )
        self.model = self.client.models.list().data[0].id

    def __call__(self, requests: list[Request]) -> Decoded:
        """Decode one batch concurrently; the server's spec-decode counts go on its first request,
        and the time of the two scrapes is reported as overhead (left out of the timing)."""
        start = time.perf_counter()
        before = self.server.metrics_text()
        scraped = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            answers = list(pool.map(self._generate, requests))
        decoded = time.perf_counter()
        after = self.server.metrics_text()
        overhead = (scraped - start) + (time.perf_counter() - decoded)
        metrics = [a.metrics for a in answers]
        new_tokens = sum(m.new_tokens for m in metrics)
        counts = self._counts(before, after, new_tokens)
        if counts is not None and counts.drafts:
            _book(metrics[0], counts)
        return Decoded([[] for _ in answers], metrics, overhead_s=overhead)

    def greedy(self, max_new_tokens: int, seed: int) -> list[str]:
        """Every prompt's greedy text, one request at a time."""
        return [
            self._generate(Request([i], max_new_tokens, GREEDY, seed + i)).text
            for i in range(len(self.prompts))
        ]

    def decode_ids(
        self, index: int, max_new_tokens: int, sampling: SamplingParams, seed: int
    ) -> tuple[list[int], list[int]]:
        """Prompt ``index`` decoded with ``sampling``: the prompt's token ids as the server
        encoded them and the output's (vLLM's ``return_token_ids``)."""
        prompt = self.prompts[index]
        path, body = self._body(prompt, max_new_tokens, sampling, seed)
        body["return_token_ids"] = True
        answer = self._post(path, body)
        choice = answer["choices"][0]
        prompt_ids = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if prompt_ids is None or choice.get("token_ids") is None:
            raise SpecError(f"the {self.engine} server returned no token ids (return_token_ids)")
        return list(prompt_ids), list(choice["token_ids"])

    def reply(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
        *,
        reply_prefix: str | None = None,
    ) -> tuple[str, int]:
        """``prompt`` (any, not only the bench's) decoded in one request: the reply's text and
        its tokens. ``reply_prefix`` starts the reply (a chat prompt continues the assistant's
        turn, vLLM's and SGLang's ``continue_final_message``; a raw one ends with it)."""
        path, body = self._body(prompt, max_new_tokens, sampling, seed)
        if reply_prefix is not None and prompt.chat:
            body["messages"].append({"role": "assistant", "content": reply_prefix})
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        elif reply_prefix is not None:
            body["prompt"] += reply_prefix
        answer = self._post(path, body)
        choice = answer["choices"][0]
        text = choice["message"]["content"] if prompt.chat else choice["text"]
        return text or "", int(answer["usage"]["completion_tokens"])

    def _body(
        self, prompt: Prompt, max_new_tokens: int, sampling: SamplingParams, seed: int
    ) -> tuple[str, dict[str, Any]]:
        """The endpoint and request body of ``prompt`` (not streamed)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or -1,
            "seed": seed,
        }
        if prompt.chat:
            body["messages"] = [{"role": "user", "content": prompt.text}]
            return "chat/completions", body
        body["prompt"] = prompt.text
        return "completions", body

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{self.server.url}/v1/{path}", json=body, timeout=self.timeout_s)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def _counts(self, before: str, after: str, new_tokens: int) -> engine_metrics.SpecCounts | None:
        if self.engine == HttpEngine.SGLANG:
            return _sglang_estimate(engine_metrics.gauges(after), new_tokens)
        prefix = self.engine.metrics_prefix
        return engine_metrics.delta(
            engine_metrics.spec_counts(before, prefix), engine_metrics.spec_counts(after, prefix)
        )

    def _generate(self, request: Request) -> Generated:
        prompt = self.prompts[request.prompt_ids[0]]
        sampling = request.sampling
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": request.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sampling.top_k:
            kwargs["extra_body"] = {"top_k": sampling.top_k}
        start = time.perf_counter()
        if prompt.chat:
            stream: Any = self.client.chat.completions.create(
                messages=[{"role": "user", "content": prompt.text}], **kwargs
            )
        else:
            stream = self.client.completions.create(prompt=prompt.text, **kwargs)
        pieces: list[str] = []
        ttft = 0.0
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                piece = choice.delta.content if prompt.chat else choice.text
                if piece:
                    ttft = ttft or time.perf_counter() - start
                    pieces.append(piece)
        total = time.perf_counter() - start
        metrics = GenerationMetrics(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            # Without usage in the stream, each text piece counts as one token.
            new_tokens=usage.completion_tokens if usage else len(pieces),
            ttft_s=ttft or total,
            total_time_s=total,
        )
        return Generated("".join(pieces), metrics)


def _book(metrics: GenerationMetrics, counts: engine_metrics.SpecCounts) -> None:
    """Put a batch's spec-decode counts on a request's metrics, as speccore records its steps:
    a drafting step is a verify step, drafting every position counted."""
    metrics.verify_steps = counts.drafts
    metrics.drafted_tokens = counts.draft_tokens
    metrics.accepted_tokens = counts.accepted_tokens
    metrics.drafted_per_position = [counts.drafts] * len(counts.accepted_per_position)
    metrics.accepted_per_position = list(counts.accepted_per_position)


def _sglang_estimate(gauges: dict[str, float], new_tokens: int) -> engine_metrics.SpecCounts | None:
    """SGLang's counts estimated from its acceptance gauges (its last logged batch) and the
    batch's new tokens: steps = tokens / acceptance length, drafted = accepted / rate."""
    length = gauges.get(engine_metrics.SGLANG_LENGTH, 0.0)
    rate = gauges.get(engine_metrics.SGLANG_RATE, 0.0)
    if length <= 1.0 or rate <= 0.0 or new_tokens <= 0:
        return None
    drafts = max(1, round(new_tokens / length))
    accepted = new_tokens - drafts
    return engine_metrics.SpecCounts(
        drafts=drafts, draft_tokens=round(accepted / rate), accepted_tokens=accepted
    )


# --- the bench ------------------------------------------------------------------------------


def measure_http(
    plan: BenchPlan,
    engine: HttpEngine,
    settings: BenchmarkRunnerSettings,
    *,
    on_rep: RepCallback,
    done: Iterable[RepRow] = (),
    corpora: Corpora | None = None,
    prompts: Sequence[Prompt] | None = None,
) -> BenchOutcome:
    """Measure every rep of `plan` not in `done` on `engine` servers (see the module's docstring).

    `prompts`: the plan's workload prompts unless given (a prompt set that is no wire
    fingerprint, such as specprompts' `agentic`)."""
    if prompts is None:
        try:
            prompts = load_prompts(str(plan.fingerprint), plan.n_prompts, plan.seed)
        except SpecError as err:
            raise MeasureError(ErrorStage.VALIDATION, f"no prompt set for this plan: {err}") from err
    source = HttpSource(plan, engine, settings, prompts, corpora or Corpora(None, None))
    return run(plan, source, on_rep=on_rep, done=done)


@dataclass(slots=True)
class HttpSource:
    """The plan's methods on `engine` servers: the command or URL of each method's, and
    those started so far (stopped when the bench ends, fails or is cancelled)."""

    plan: BenchPlan
    engine: HttpEngine
    settings: BenchmarkRunnerSettings
    prompts: Sequence[Prompt]
    corpora: Corpora
    started: list[EngineServer] = field(default_factory=list)
    opened: dict[str, HttpMethod] = field(default_factory=dict)

    @property
    def needs_every_method(self) -> bool:
        """The gate's evidence (gate_http) needs every candidate's server, stored reps or not."""
        gate = self.plan.quality_gate
        if gate == GateMethod.TOPK5:
            return self.engine == HttpEngine.VLLM
        # speccore's own server (`specops serve engine`): its gate decodes in-process.
        on_engine = self.engine in (HttpEngine.VLLM, HttpEngine.SGLANG)
        return gate == GateMethod.EXACT or (on_engine and gate in _ANSWERED)

    def fields(self, candidates: Mapping[str, Candidate]) -> Fields:
        """Per method launched (not attached to by URL): the flags its server gets after the
        model and address; a candidate the engine cannot run has none."""
        found: Fields = {}
        for key, candidate in {BASELINE_ID: None, **candidates}.items():
            if key in self.settings.bench_engine_urls:
                continue
            with contextlib.suppress(EngineCannotRun, SpecError):
                found[key] = {"launch_args": self._args(candidate)}
        return found

    def open(self, stack: contextlib.ExitStack) -> Schedule:
        stack.callback(self.stop)
        # Prompt indices stand for the prompts (HttpMethod._generate).
        return schedule(self.plan, [[i] for i in range(len(self.prompts))])

    def baseline(self) -> Method:
        try:
            return self._start(BASELINE_ID, None)
        except (EngineStartError, openai.OpenAIError, httpx.HTTPError) as err:
            raise MeasureError(ErrorStage.BENCHMARK, f"the baseline server did not start: {err}") from err

    def method(self, candidate: Candidate) -> Method:
        """A candidate's server; refused by the engine (validation), or did not start (model_load)."""
        try:
            return self._start(candidate.candidate_id, candidate)
        except EngineCannotRun as err:
            raise CandidateFailed(ErrorStage.VALIDATION, str(err)) from err
        except (EngineStartError, SpecError, openai.OpenAIError, httpx.HTTPError) as err:
            message = f"its {self.engine} server did not start: {describe(err)}"
            raise CandidateFailed(ErrorStage.MODEL_LOAD, message) from err

    def evidence(self, live: Collection[str]) -> Fields:
        methods = {m: self.opened[m] for m in live}
        if self.plan.quality_gate == GateMethod.EXACT:
            return _greedy_agreement(self.plan, methods)
        if not self.needs_every_method:
            return {}
        if self.plan.quality_gate == GateMethod.TOPK5:
            return _top5(self.plan, methods)
        if self.plan.quality_gate == GateMethod.MMLU_SLICE:
            return _mmlu(self.plan, methods)
        return _structured(self.plan, methods)

    def stop(self) -> None:
        for server in reversed(self.started):
            server.stop()

    def _start(self, key: str, candidate: Candidate | None) -> HttpMethod:
        """Start (or attach to) the server of method `key` and connect to it."""
        server = EngineServer(self._spec(key, candidate))
        self.started.append(server)
        log.info("run %s: starting the %s server of %s", self.plan.run_id, self.engine, key)
        server.start()
        method = HttpMethod(self.engine, server, self.prompts, self.settings.bench_engine_request_timeout_s)
        self.opened[key] = method
        return method

    def _args(self, candidate: Candidate | None) -> list[str]:
        s = self.settings
        paths = {}
        if candidate is not None and is_head_id(candidate.draft):
            paths[str(candidate.draft)] = str(registry_head(str(candidate.draft), self.corpora))
        extra = s.engine_args(self.engine.value)
        if self.engine == HttpEngine.SPECOPS:
            # speccore's server runs where and as the in-process bench would.
            extra = [
                "--device",
                s.bench_device,
                "--dtype",
                s.bench_dtype,
                "--threads",
                str(s.threads),
                *extra,
            ]
        return launch_args(self.engine, candidate, draft_paths=paths, extra_args=extra)

    def _spec(self, key: str, candidate: Candidate | None) -> ServerSpec:
        s = self.settings
        url = s.bench_engine_urls.get(key)
        if url is not None:
            return ServerSpec(self.engine, None, url, s.bench_engine_start_timeout_s)
        port = free_port()
        model = self.plan.target.model_ref
        if self.engine != HttpEngine.SPECOPS:
            model = engine_checkpoint(model)  # an offline alias as the directory vLLM loads
        command = [
            *server_command(self.engine, s.engine_command(self.engine), model, port),
            *self._args(candidate),
        ]
        threads = str(s.threads)
        env = {"SPECOPS_THREADS": threads, "OMP_NUM_THREADS": threads}
        return ServerSpec(self.engine, command, f"http://{HOST}:{port}", s.bench_engine_start_timeout_s, env)


def _top5(plan: BenchPlan, methods: dict[str, HttpMethod]) -> dict[str, dict[str, Any]]:
    """Per candidate still measured, its Measurement fields for the topk5 gate: its outputs on
    the gate's prompts with the plan's sampling, scored by the baseline server teacher-forced
    (gate_http), and, greedy, the share of prompts whose tokens are the baseline's own. A
    candidate whose decoding fails gets none (its gate then fails it)."""
    baseline = methods[BASELINE_ID]
    reader = gate_http.TeacherForcing(baseline.server.url, baseline.model, baseline.timeout_s)
    sampling = SamplingParams.of(plan.sampling)
    n = min(GATE_PROMPTS, len(baseline.prompts))
    want: list[list[int]] | None = None
    if sampling.greedy:
        try:
            want = [baseline.decode_ids(i, plan.max_new_tokens, sampling, plan.seed + i)[1] for i in range(n)]
        except (httpx.HTTPError, SpecError, KeyError) as err:
            log.warning("run %s: the baseline's greedy outputs failed: %s", plan.run_id, describe(err))
    found: dict[str, dict[str, Any]] = {}
    for cid, method in methods.items():
        if cid == BASELINE_ID:
            continue
        try:
            scored, outputs = [], []
            for i in range(n):
                prompt_ids, output = method.decode_ids(i, plan.max_new_tokens, sampling, plan.seed + i)
                scored.append(gate_http.score_positions(reader.entries(prompt_ids, output), output, sampling))
                outputs.append(output)
        except (httpx.HTTPError, SpecError, ValueError, KeyError) as err:
            log.warning("run %s: the topk5 evidence of %s failed: %s", plan.run_id, cid, describe(err))
            continue
        found[cid] = {"top5": gate_http.top5_evidence(scored)}
        if want is not None:
            found[cid]["greedy_agreement"] = sum(a == b for a, b in zip(want, outputs, strict=True)) / n
    return found


_ANSWERED = (GateMethod.MMLU_SLICE, GateMethod.CONSTRAINT_VIOLATION)
# A server's answer the gate's evidence cannot use (the candidate then gets none).
_DECODE_ERRORS = (openai.OpenAIError, httpx.HTTPError, SpecError, KeyError, ValueError)


def _against_baseline(
    plan: BenchPlan,
    methods: Mapping[str, HttpMethod],
    what: str,
    decode: Callable[[HttpMethod], _T],
    fields: Callable[[_T, _T], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Per candidate still measured, `fields` of the baseline's and its own `decode`; a
    candidate whose decoding fails gets none (its gate then fails it), and all do when the
    baseline's fails."""
    try:
        want = decode(methods[BASELINE_ID])
    except _DECODE_ERRORS as err:
        log.warning("run %s: the baseline's %s failed: %s", plan.run_id, what, describe(err))
        return {}
    found: dict[str, dict[str, Any]] = {}
    for cid, method in methods.items():
        if cid == BASELINE_ID:
            continue
        try:
            got = decode(method)
        except _DECODE_ERRORS as err:
            log.warning("run %s: the %s of %s failed: %s", plan.run_id, what, cid, describe(err))
            continue
        found[cid] = fields(want, got)
    return found


def _mmlu(plan: BenchPlan, methods: Mapping[str, HttpMethod]) -> dict[str, dict[str, Any]]:
    """`Measurement.mmlu` per candidate: the seeded MMLU questions answered greedily, each reply
    started with specprompts.mmlu's prefix, as the in-process gate asks them."""
    questions = mmlu_questions(MMLU_QUESTIONS, plan.seed)
    asked = [Prompt(q["id"], question_text(q), True, "mmlu") for q in questions]

    def answers(method: HttpMethod) -> list[int | None]:
        replies = [
            method.reply(p, MMLU_NEW_TOKENS, GREEDY, plan.seed, reply_prefix=ANSWER_PREFIX) for p in asked
        ]
        return [parse_answer(text) for text, _ in replies]

    def fields(base: list[int | None], cand: list[int | None]) -> dict[str, Any]:
        evidence = MmluEvidence(
            seed=plan.seed,
            question_ids=[q["id"] for q in questions],
            truth=[q["answer"] for q in questions],
            baseline_answers=base,
            candidate_answers=cand,
        )
        return {"mmlu": evidence}

    return _against_baseline(plan, methods, "MMLU answers", answers, fields)


def _structured(plan: BenchPlan, methods: Mapping[str, HttpMethod]) -> dict[str, dict[str, Any]]:
    """`Measurement.structured` per candidate: the workload's constraint tasks (JSON Schema, or
    code that must parse for `code`) decoded with the plan's sampling (task i: seed + i), each
    reply's violations counted; a reply of the whole budget was cut by it."""
    tasks = constraint_tasks(str(plan.fingerprint), STRUCTURED_TASKS, plan.seed)
    sampling = SamplingParams.of(plan.sampling)
    budget = CODE_NEW_TOKENS if tasks[0].check == CodeTask.check else STRUCTURED_NEW_TOKENS

    def replies(method: HttpMethod) -> list[tuple[str, int]]:
        return [method.reply(t.prompt, budget, sampling, plan.seed + i) for i, t in enumerate(tasks)]

    def fields(base: list[tuple[str, int]], cand: list[tuple[str, int]]) -> dict[str, Any]:
        base_found, cand_found = count_replies(tasks, base, budget), count_replies(tasks, cand, budget)
        evidence = StructuredEvidence(
            check=tasks[0].check,
            task_ids=[t.prompt.id for t in tasks],
            baseline_violations=[v for v, _ in base_found],
            candidate_violations=[v for v, _ in cand_found],
            candidate_problems=[p for _, p in cand_found],
            baseline_tokens=sum(n for _, n in base),
            candidate_tokens=sum(n for _, n in cand),
        )
        return {"structured": evidence}

    return _against_baseline(plan, methods, "structured replies", replies, fields)


def _greedy_agreement(plan: BenchPlan, methods: Mapping[str, HttpMethod]) -> dict[str, dict[str, Any]]:
    """`Measurement.greedy_agreement` per candidate: the share of prompts whose greedy text is
    the baseline's."""

    def texts(method: HttpMethod) -> list[str]:
        return method.greedy(plan.max_new_tokens, plan.seed)

    def fields(want: list[str], got: list[str]) -> dict[str, Any]:
        return {"greedy_agreement": sum(a == b for a, b in zip(want, got, strict=True)) / len(want)}

    return _against_baseline(plan, methods, "greedy outputs", texts, fields)
