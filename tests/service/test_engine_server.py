"""`specops serve engine` as its own process (through the CLI), smollm2 with ngram, driven by the
official `openai` client: its greedy text is `specops generate --method none`'s, 32 concurrent
requests all finish with it, and /metrics counts what the engine counts for the same requests."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fixtures.engine import engine_server

from speccore.engine import Engine, Generation, Request
from speccore.models import LoadedModel
from speccore.proposers import ProposerConfig, default_k
from specops.cli import main as specops

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
CHAT = ["Name three colours.", "What is 2 + 2? Answer briefly."]
TEXTS = [
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "Once upon a time, there was a",
    "1, 2, 3, 4, 5,",
    "import numpy as np\nimport",
    "The quick brown fox",
    "Water boils at",
    "for i in range(10):\n    print(",
]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with engine_server(["--model", MODEL, "--method", "ngram"], log) as engine:
        yield engine.url


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_metrics_show_every_draft_position_before_the_first_request(server: str) -> None:
    # First in the module: the server has served nothing yet.
    k = default_k("ngram")
    samples = _metrics(server)
    per_pos = [
        _counter(samples, "spec_decode_num_accepted_tokens_per_pos", position=str(p)) for p in range(k)
    ]
    assert per_pos == [0.0] * k
    keys = [key for key in samples if key.startswith("specops:spec_decode_num_accepted_tokens_per_pos_total")]
    assert len(keys) == k


def _greedy(target: LoadedModel, method: str, prompts: list[list[int]], **kw: object) -> list[Generation]:
    config = ProposerConfig(k=default_k(method)) if method != "none" else None
    requests = [Request(ids, MAX_TOKENS, **kw) for ids in prompts]  # type: ignore[arg-type]
    return Engine(target, method, config).generate(requests)


def _generate_cli(capsys: pytest.CaptureFixture[str], text: str, *, chat: bool) -> str:
    """`specops generate --method none --json`'s text, run in this process."""
    argv = ["generate", "--model", MODEL, "--device", "cpu", "--dtype", "float32", "--method", "none"]
    argv += ["--prompt", text, "--max-new-tokens", str(MAX_TOKENS), "--json", *(["--chat"] if chat else [])]
    capsys.readouterr()
    assert specops(argv) == 0
    return str(json.loads(capsys.readouterr().out)["text"])


def test_greedy_text_is_specops_generates_streaming_or_not(
    client: openai.OpenAI, smollm: LoadedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    text = CHAT[0]
    expected_chat = _generate_cli(capsys, text, chat=True)
    expected_plain = _generate_cli(capsys, TEXTS[1], chat=False)

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS, temperature=0
    )
    assert chat.choices[0].message.content == expected_chat
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and chat.usage.completion_tokens <= MAX_TOKENS
    assert chat.model == MODEL and chat.id.startswith("chatcmpl-")

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            max_completion_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == expected_chat
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == chat.choices[0].finish_reason
    assert chunks[-1].usage == chat.usage and not chunks[-1].choices

    done = client.completions.create(model=MODEL, prompt=TEXTS[1], max_tokens=MAX_TOKENS, temperature=0)
    assert done.choices[0].text == expected_plain
    assert done.usage is not None and done.usage.prompt_tokens > 0
    assert done.usage.prompt_tokens_details is None  # no prefix cache: nothing to tell
    pieces = client.completions.create(
        model=MODEL, prompt=TEXTS[1], max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in pieces) == expected_plain
    # Token ids, and several prompts in one request (choice i answers prompt i).
    ids = smollm.encode_prompt(TEXTS[1], chat=False)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0)
    assert by_ids.choices[0].text == expected_plain
    two = client.completions.create(
        model=MODEL, prompt=[TEXTS[1], TEXTS[1] + expected_plain], max_tokens=MAX_TOKENS, temperature=0
    )
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == expected_plain


def _metrics(url: str) -> dict[str, float]:
    """The server's specops: samples, keyed by name and labels as exposed."""
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("specops:"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _counter(samples: dict[str, float], name: str, **labels: str) -> float:
    wanted = {"model_name": MODEL, **labels}
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if base == f"specops:{name}_total" and found == wanted:
            total += value
    return total


def test_32_concurrent_requests_finish_with_greedy_text_and_metrics_count_them(
    server: str, smollm: LoadedModel
) -> None:
    prompts = [smollm.encode_prompt(t, chat=False) for t in TEXTS]
    expected = [g.text for g in _greedy(smollm, "none", prompts)]
    # The same requests through the server's method, in this process: greedy is deterministic, so
    # each request's counts are the ones the server must have summed.
    own = [g.metrics for g in _greedy(smollm, "ngram", prompts)]
    before = _metrics(server)

    async def drive() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as c:
            calls = [
                c.completions.create(model=MODEL, prompt=TEXTS[i % 8], max_tokens=MAX_TOKENS, temperature=0)
                for i in range(32)
            ]
            return [r.choices[0].text for r in await asyncio.gather(*calls)]

    texts = asyncio.run(drive())
    assert texts == [expected[i % 8] for i in range(32)]

    after = _metrics(server)

    def grew(name: str, **labels: str) -> float:
        return _counter(after, name, **labels) - _counter(before, name, **labels)

    reps = 4
    assert grew("generation_tokens") == reps * sum(m.new_tokens for m in own)
    assert grew("prompt_tokens") == reps * sum(len(p) for p in prompts)
    assert grew("spec_decode_num_drafts") == reps * sum(
        m.drafted_per_position[0] if m.drafted_per_position else 0 for m in own
    )
    assert grew("spec_decode_num_draft_tokens") == reps * sum(m.drafted_tokens for m in own)
    assert grew("spec_decode_num_accepted_tokens") == reps * sum(m.accepted_tokens for m in own)
    assert sum(m.accepted_tokens for m in own) > 0  # the prompts make ngram accept something
    depth = max(len(m.accepted_per_position) for m in own)
    for pos in range(depth):
        at = sum(m.accepted_per_position[pos] for m in own if pos < len(m.accepted_per_position))
        assert grew("spec_decode_num_accepted_tokens_per_pos", position=str(pos)) == reps * at
    finished = grew("request_success", finished_reason="stop") + grew(
        "request_success", finished_reason="length"
    )
    assert finished == 32
    histogram_count = f'specops:e2e_request_latency_seconds_count{{model_name="{MODEL}"}}'
    assert after[histogram_count] - before.get(histogram_count, 0.0) == 32
    assert after[f'specops:num_requests_running{{model_name="{MODEL}"}}'] == 0


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="word " * 8300, max_tokens=MAX_TOKENS, temperature=0)
    assert "8192" in too_long.value.message and str(MAX_TOKENS) in too_long.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)
    assert "gpt-4o" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as cold:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=-1
        )
    assert "temperature" in cold.value.message


def _openai_error(response: httpx.Response, status: int) -> str:
    """The message of an OpenAI-shaped error of ``status``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["message"])


def test_every_error_is_openai_shaped(server: str) -> None:
    url = f"{server}/v1/completions"
    nested = "[" * 10_000 + "]" * 10_000
    message = _openai_error(
        httpx.post(url, content=nested, headers={"Content-Type": "application/json"}), 400
    )
    assert "JSON" in message
    bad = httpx.post(url, content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert "JSON" in _openai_error(bad, 400)
    assert "/v1/nothing" in _openai_error(httpx.get(f"{server}/v1/nothing"), 404)
    assert "GET" in _openai_error(httpx.get(url), 405)


def test_a_json_body_without_its_content_type_is_a_415_that_names_the_header(server: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    form = httpx.post(
        f"{server}/v1/completions",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},  # what curl -d sends
    )
    assert "-H 'Content-Type: application/json'" in _openai_error(form, 415)
    bare = httpx.post(f"{server}/tokenize", content=body.encode())
    assert "Content-Type" in _openai_error(bare, 415)
    assert httpx.post(
        f"{server}/v1/completions", content=body, headers={"Content-Type": "application/json"}
    ).is_success


def test_tokenize_and_detokenize_round_trip_and_count_as_usage(server: str, client: openai.OpenAI) -> None:
    text = "Café 東京 🦊 " + TEXTS[0]
    tokens = httpx.post(f"{server}/tokenize", json={"model": MODEL, "prompt": text}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 8192
    back = httpx.post(f"{server}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}).json()
    assert back == {"prompt": text}
    assert tokens["token_strs"] is None
    strs = httpx.post(f"{server}/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["Hello", "Ġworld"]  # the tokenizer's own pieces (byte-level BPE)
    usage = client.completions.create(model=MODEL, prompt=text, max_tokens=1, temperature=0).usage
    assert usage is not None and usage.prompt_tokens == tokens["count"]
    messages = [{"role": "user", "content": CHAT[0]}]
    chat = httpx.post(f"{server}/tokenize", json={"model": MODEL, "messages": messages}).json()
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.prompt_tokens == chat["count"]
    bare = httpx.post(f"{server}/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert bare.json()["count"] < chat["count"]
    assert "gpt-4o" in _openai_error(
        httpx.post(f"{server}/detokenize", json={"model": "gpt-4o", "tokens": [1]}), 404
    )
    assert "version" in httpx.get(f"{server}/version").json()


def test_n_choices_with_a_seed_repeat(client: openai.OpenAI) -> None:
    def ask() -> list[str]:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": CHAT[1]}],
            max_tokens=MAX_TOKENS,
            temperature=0.9,
            n=2,
            seed=7,
        )
        assert [c.index for c in reply.choices] == [0, 1]
        return [c.message.content or "" for c in reply.choices]

    first = ask()
    assert all(first) and ask() == first


def test_stop_strings_cut_the_text(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=TEXTS[3], max_tokens=MAX_TOKENS, temperature=0)
    text = full.choices[0].text
    stop = text.strip().split()[2]  # a number a few tokens in
    cut = client.completions.create(
        model=MODEL, prompt=TEXTS[3], max_tokens=MAX_TOKENS, temperature=0, stop=[stop, "never"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text and text.startswith(cut.choices[0].text)
    assert len(cut.choices[0].text) < len(text)


def test_a_client_that_leaves_mid_stream_cancels_its_request(server: str, client: openai.OpenAI) -> None:
    before = _counter(_metrics(server), "request_success", finished_reason="abort")

    async def leave_early() -> None:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as c:
            # The first request keeps the worker busy while the second waits for a row.
            busy = asyncio.ensure_future(
                c.completions.create(model=MODEL, prompt=TEXTS[2], max_tokens=24, temperature=0)
            )
            await asyncio.sleep(0.2)
            stream = await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": CHAT[0]}], max_tokens=24, stream=True
            )
            async for _ in stream:  # the role chunk, then leave
                break
            await stream.close()
            await busy

    asyncio.run(leave_early())
    deadline = time.monotonic() + 30
    while _counter(_metrics(server), "request_success", finished_reason="abort") == before:
        assert time.monotonic() < deadline, "the abandoned request was never cancelled"
        time.sleep(0.2)


def test_sigterm_lets_the_requests_under_way_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = _generate_cli(capsys, CHAT[0], chat=True)
    with (
        engine_server(["--model", MODEL, "--method", "ngram"], tmp_path / "engine.log") as engine,
        openai.OpenAI(base_url=f"{engine.url}/v1", api_key="-", max_retries=0) as client,
    ):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": CHAT[0]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        chunks = [next(stream)]  # the server holds the request: it sent the role
        engine.proc.send_signal(signal.SIGTERM)
        chunks.extend(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_vllm_stopping_fields_decide_where_the_output_ends(
    client: openai.OpenAI, smollm: LoadedModel
) -> None:
    def chat(**extra: object) -> openai.types.chat.ChatCompletion:
        messages = [{"role": "user", "content": CHAT[1]}]
        return client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=64,
            temperature=0,
            extra_body=extra,  # type: ignore[arg-type]
        )

    short = chat()
    assert short.choices[0].finish_reason == "stop" and short.usage is not None
    ends_at = short.usage.completion_tokens
    longer = chat(min_tokens=ends_at + 6)
    assert longer.usage is not None and longer.usage.completion_tokens >= ends_at + 6
    assert (longer.choices[0].message.content or "").startswith(short.choices[0].message.content or "")
    endless = chat(ignore_eos=True)
    assert endless.choices[0].finish_reason == "length"
    assert endless.usage is not None and endless.usage.completion_tokens == 64

    full = client.completions.create(model=MODEL, prompt=TEXTS[3], max_tokens=MAX_TOKENS, temperature=0)
    comma = smollm.tokenizer.encode(",", add_special_tokens=False)
    assert len(comma) == 1 and "," in full.choices[0].text
    cut = client.completions.create(
        model=MODEL,
        prompt=TEXTS[3],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"stop_token_ids": comma},
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full.choices[0].text.split(",")[0]


def test_min_p_keeps_greedy_text(client: openai.OpenAI) -> None:
    def text(**extra: object) -> str:
        reply = client.completions.create(
            model=MODEL, prompt=TEXTS[0], max_tokens=MAX_TOKENS, temperature=0, extra_body=extra
        )
        return reply.choices[0].text

    assert text(min_p=0.3) == text()


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=TEXTS[1],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )
    )
    usages = [c.usage for c in chunks]
    assert len(chunks) > 2 and all(u is not None for u in usages)
    done = [u.completion_tokens for u in usages if u is not None]
    assert done == sorted(done) and done[0] > 0 and done[-1] == MAX_TOKENS
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages if u is not None)


def test_fields_the_server_does_not_implement_are_refused_by_name(client: openai.OpenAI) -> None:
    for field, value in (("bad_words", ["Paris"]), ("include_stop_str_in_output", True), ("min_tokens", 99)):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(
                model=MODEL, prompt=TEXTS[1], max_tokens=8, temperature=0, extra_body={field: value}
            )
        assert refused.value.param == field and field in refused.value.message
