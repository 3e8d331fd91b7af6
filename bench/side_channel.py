"""The two side channels of issue 20, attacked through the real engine server (`specops serve
engine`, smollm2 with n-gram drafting, each request streamed over HTTP), with and without
their mitigations; writes the attackers' ROC AUC, the trials, and each mitigation's
throughput cost.

**Acceptance pattern** (F-S2, F-S3). A victim streams a greedy completion of a prompt of one
of two classes (`--classes`: a copy task, "repeat this hex string", or chat from ShareGPT;
code from HumanEval vs chat is the other choice, where n-gram's acceptance differs too
little on smollm2 for the attack to work: AUC 0.47 unmitigated), as a chat turn; the attacker sees only
the arrival time of each SSE chunk (what an encrypted stream shows) and tells the class.
Every prompt is cut to the same PROMPT_TOKENS tokens (ASCII text) and only prompts whose
completion runs to max tokens in every setting count, so neither the prompt's length nor the
output's says the class (an encrypted stream shows both); the features start at the first
chunk (the time to it is the prefill's). Features: chunk count, decode time (first to last
chunk), gap sd and max gap (few features: the trials are few); a logistic regression (numpy,
L2) over them, 5-fold cross-validated (repeated 5 times, shuffled), AUC of the held-out
scores (Mann-Whitney). Settings, one tenant each on one server, every prompt asked in all
three (interleaved, the order rotated per prompt): speculation with no mitigation, F-S2
(paced release, one token per `--pace-ms`), F-S3 (the tenant opted out: plain decoding).

**Shared cache** (F-S1). The server drafts from its cross-request n-gram pool
(`--draft-pool`). Tenant A asks half of the candidate prompts; tenant B then asks every
candidate (random order) and guesses "A asked it" from its own decode time per token (and,
second, from its chunks per token: the burst structure it sees of its own stream), AUC over
the candidates. Settings on one server, interleaved: the single-tenant tier (one pool for
every tenant) and F-S1 (both tenants in the shared tier: a pool per tenant). Same
candidates and halves in both (their pools never meet).

The bench is the trusted proxy of its servers: it signs each request's tenant claim with a
key of its own (`--tenant-key-file`), as the shared tiers require.

Throughput: tokens / wall time of the requests of a setting (request sent to last chunk),
and its ratio to the unmitigated setting's in the same run.

    make side-channel        # .venv/bin/python bench/side_channel.py --out bench/results/side-channel.json
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import machine

from specops.report.launch import engine_servers
from specops_schemas.security import JitterSettings, SecurityPolicy, SecurityTier
from specplatform.tenant_signature import TenantSigner
from specprompts.sets import load_prompts

MODEL = "smollm2-135m-instruct"
METHOD = "ngram"
PROMPT_TOKENS = 64
GOAL_AUC = 0.55
# The key this run's servers share with it, to sign tenant claims; new each run.
TENANT_KEY = secrets.token_hex(32).encode()


@dataclass(frozen=True, slots=True)
class Streamed:
    """One streamed completion as the client saw it."""

    sent: float  # perf_counter when the request was sent
    chunks: list[float]  # arrival of each chunk that carried text
    tokens: int
    finish_reason: str | None
    text: str

    @property
    def decode_s(self) -> float:
        return self.chunks[-1] - self.chunks[0] if len(self.chunks) > 1 else 0.0

    @property
    def wall_s(self) -> float:
        return self.chunks[-1] - self.sent if self.chunks else 0.0


@contextmanager
def server(args: list[str], name: str, log_dir: Path, threads: int) -> Iterator[str]:
    """The URL of a `specops serve engine` of MODEL with ``args``, its log ``log_dir/name.log``."""
    cpu = ["--threads", str(threads), "--device", "cpu", "--dtype", "float32"]
    with engine_servers({name: args}, MODEL, cpu, log_dir) as urls:
        yield urls[name]


def stream(client: httpx.Client, tenant: str, prompt: list[int], max_tokens: int) -> Streamed:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[float] = []
    text, tokens, reason = "", 0, None
    sent = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body, auth=TenantSigner(TENANT_KEY, tenant)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                raise SystemExit(f"the server failed a request: {event['error']}")
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    chunks.append(now)
                    text += choice["text"]
                reason = choice.get("finish_reason") or reason
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return Streamed(sent, chunks, tokens, reason, text)


# --- the attacker's statistics ----------------------------------------------------------------


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties half (Mann-Whitney U / n_pos n_neg)."""
    scores = np.concatenate([pos, neg])
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def auc_se(a: float, n_pos: int, n_neg: int) -> float:
    """Hanley and McNeil's standard error of an AUC."""
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return float(np.sqrt(max(var, 0.0)))


def features(s: Streamed) -> list[float]:
    gaps = np.diff(np.array(s.chunks))
    return [len(s.chunks), s.decode_s, gaps.std(), gaps.max()]


FEATURES = ["chunks", "decode_s", "gap_sd", "gap_max"]


def logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 500, lr: float = 0.5) -> np.ndarray:
    """Weights (bias last) of an L2-regularised logistic regression, by gradient descent."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(xb.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0.0] / len(y)
        w -= lr * grad
    return w


def cv_auc(x: np.ndarray, y: np.ndarray, folds: int = 5, repeats: int = 5, seed: int = 0) -> float:
    """Mean over repeats of the AUC of held-out logistic scores (stratified k-fold)."""
    rng = np.random.default_rng(seed)
    aucs = []
    for _ in range(repeats):
        scores = np.zeros(len(y))
        fold_of = np.zeros(len(y), dtype=int)
        for label in (0, 1):
            idx = rng.permutation(np.flatnonzero(y == label))
            fold_of[idx] = np.arange(len(idx)) % folds
        for f in range(folds):
            train, test = fold_of != f, fold_of == f
            mu, sd = x[train].mean(0), x[train].std(0) + 1e-12
            w = logistic((x[train] - mu) / sd, y[train])
            scores[test] = np.hstack([(x[test] - mu) / sd, np.ones((test.sum(), 1))]) @ w
        aucs.append(auc(scores[y == 1], scores[y == 0]))
    return float(np.mean(aucs))


def throughput(runs: list[Streamed]) -> float:
    return sum(r.tokens for r in runs) / sum(r.wall_s for r in runs)


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"specops:{name}"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- the attacks -------------------------------------------------------------------------------


def copy_text(seed: int) -> str:
    """A copy task (as tests/service/test_engine_drift.py's drifted traffic): n-gram drafts it well."""
    rng = random.Random(seed)
    return "Repeat this string exactly: " + "".join(rng.choice("0123456789abcdef") for _ in range(160))


def cut_prompts(target: Any, workload: str, n: int, skip: int = 0) -> list[list[int]]:
    """``n`` prompts of the workload (a specprompts workload, or ``copy``) at least
    PROMPT_TOKENS long, cut to PROMPT_TOKENS tokens and sent as a chat turn; ASCII only, so
    that every token is a chunk of text of its own (a token that ends inside a multi-byte
    character sends no chunk: a channel of the text, not of the acceptance)."""
    if workload == "copy":
        texts = [copy_text(seed) for seed in range(skip + n)]
    else:
        texts = [p.text for p in load_prompts(workload, 164 if workload == "code" else 400)]
    ids = [target.encode_prompt(text, chat=False) for text in texts if text.isascii()]
    long = [i[:PROMPT_TOKENS] for i in ids if len(i) >= PROMPT_TOKENS][skip:]
    if len(long) < n:
        raise SystemExit(f"{workload}: {len(long)} prompts of {PROMPT_TOKENS}+ tokens, asked for {n}")
    # As one user turn of the chat template: the assistant's answer is what is generated.
    return [target.encode_prompt(target.tokenizer.decode(i), chat=True) for i in long[:n]]


def acceptance_pattern(
    url: str, prompts: dict[str, list[list[int]]], max_tokens: int, pace_ms: float
) -> dict[str, Any]:
    """``prompts``: two classes; the first is the positive one (label 1)."""
    settings = {
        "speculation, no mitigation": "victim-open",
        f"F-S2 pace {pace_ms:g} ms": "victim-paced",
        "F-S3 speculation off": "victim-plain",
    }
    first, second = prompts
    labelled = [(p, 1) for p in prompts[first]] + [(p, 0) for p in prompts[second]]
    random.Random(1).shuffle(labelled)
    runs: dict[str, list[tuple[Streamed, int]]] = {s: [] for s in settings}
    slips = metric(url, "paced_slips_total")
    with httpx.Client(base_url=url, timeout=300) as client:
        for warm in labelled[:2]:
            for tenant in settings.values():
                stream(client, tenant, warm[0], max_tokens)
        for i, (prompt, label) in enumerate(labelled):
            names = list(settings)
            names = names[i % 3 :] + names[: i % 3]
            for name in names:
                runs[name].append((stream(client, settings[name], prompt, max_tokens), label))
            if i % 20 == 19:
                print(f"acceptance pattern: {i + 1}/{len(labelled)} prompts", file=sys.stderr)
    slips = metric(url, "paced_slips_total") - slips
    # Only prompts whose completion ran to max_tokens in every setting (the length says nothing).
    full = [
        i
        for i in range(len(labelled))
        if all(runs[s][i][0].tokens == max_tokens and len(runs[s][i][0].chunks) > 1 for s in settings)
    ]
    base = throughput([runs[next(iter(settings))][i][0] for i in full])
    out: dict[str, Any] = {}
    for name in settings:
        kept = [runs[name][i] for i in full]
        x = np.array([features(s) for s, _ in kept])
        y = np.array([label for _, label in kept])
        a = cv_auc(x, y)
        tps = throughput([s for s, _ in kept])
        out[name] = {
            "auc": round(a, 3),
            "auc_se": round(auc_se(a, int(y.sum()), int(len(y) - y.sum())), 3),
            "trials": len(kept),
            f"trials_{first}": int(y.sum()),
            f"trials_{second}": int(len(y) - y.sum()),
            # One feature, no fitting: fewer chunks (more tokens a burst) -> the first class.
            "auc_chunks": round(auc(-x[y == 1, 0], -x[y == 0, 0]), 3),
            "tokens_per_s": round(tps, 2),
            "throughput_ratio": round(tps / base, 3),
            "median_chunks": statistics.median(len(s.chunks) for s, _ in kept),
            "median_decode_ms_per_token": round(
                1000 * statistics.median(s.decode_s / (s.tokens - 1) for s, _ in kept), 1
            ),
        }
    return {
        "classes": [first, second],
        "settings": out,
        "per_trial": {  # label (1: the first class), chunks, decode seconds
            name: [[y, len(s.chunks), round(s.decode_s, 4)] for s, y in (runs[name][i] for i in full)]
            for name in settings
        },
        "prompts_asked": len(labelled),
        "dropped_short": len(labelled) - len(full),
        "paced_slips": slips,
        "features": FEATURES,
        "classifier": "logistic regression (L2 1.0), standardised features, 5-fold stratified CV x 5 repeats",
    }


def shared_cache(url: str, candidates: list[list[int]], max_tokens: int) -> dict[str, Any]:
    settings = {
        "shared pool (single_tenant tier)": ("a-single", "b-single"),
        "F-S1 per-tenant pools": ("a-iso", "b-iso"),
    }
    rng = random.Random(2)
    asked = set(rng.sample(range(len(candidates)), len(candidates) // 2))
    probes: dict[str, list[tuple[Streamed, int]]] = {s: [] for s in settings}
    victim: dict[str, list[Streamed]] = {s: [] for s in settings}
    with httpx.Client(base_url=url, timeout=300) as client:
        for i, j in enumerate(sorted(asked)):
            for name in list(settings)[i % 2 :] + list(settings)[: i % 2]:
                victim[name].append(stream(client, settings[name][0], candidates[j], max_tokens))
        order = list(range(len(candidates)))
        rng.shuffle(order)
        for i, j in enumerate(order):
            for name in list(settings)[i % 2 :] + list(settings)[: i % 2]:
                probes[name].append(
                    (stream(client, settings[name][1], candidates[j], max_tokens), int(j in asked))
                )
    base_name = next(iter(settings))
    base = throughput(victim[base_name] + [s for s, _ in probes[base_name]])
    out: dict[str, Any] = {}
    for name in settings:
        kept = [(s, y) for s, y in probes[name] if s.tokens > 1 and len(s.chunks) > 1]
        pos = [s for s, y in kept if y]
        neg = [s for s, y in kept if not y]

        def score(s: Streamed, by: str) -> float:
            # Faster, or fewer bursts per token: "A asked it" (the direction is fixed, not fit).
            return -s.decode_s / (s.tokens - 1) if by == "time" else -len(s.chunks) / s.tokens

        a_time = auc(np.array([score(s, "time") for s in pos]), np.array([score(s, "time") for s in neg]))
        a_bursts = auc(
            np.array([score(s, "bursts") for s in pos]), np.array([score(s, "bursts") for s in neg])
        )
        tps = throughput(victim[name] + [s for s, _ in probes[name]])
        out[name] = {
            "auc": round(a_time, 3),
            "auc_se": round(auc_se(a_time, len(pos), len(neg)), 3),
            "auc_bursts": round(a_bursts, 3),
            "trials": len(kept),
            "trials_asked": len(pos),
            "trials_not_asked": len(neg),
            "tokens_per_s": round(tps, 2),
            "throughput_ratio": round(tps / base, 3),
        }
    return {
        "settings": out,
        "candidates": len(candidates),
        "asked_by_a": len(asked),
        "attacker": "B's own decode time per token (auc) or chunks per token (auc_bursts); faster = asked",
    }


def policies(path: Path, pace_ms: float) -> None:
    pace = JitterSettings(mode="pace", interval_ms=pace_ms)
    own = [
        SecurityPolicy(tenant_id="victim-paced", version=1, tier=SecurityTier.SHARED, jitter=pace),
        SecurityPolicy(
            tenant_id="victim-plain",
            version=1,
            tier=SecurityTier.MULTI_TENANT_ISOLATED,
            speculation_opt_out=True,
        ),
        SecurityPolicy(tenant_id="a-iso", version=1, tier=SecurityTier.SHARED),
        SecurityPolicy(tenant_id="b-iso", version=1, tier=SecurityTier.SHARED),
    ]  # the others (victim-open, a-single, b-single): the default, single_tenant without jitter
    path.write_text(json.dumps([p.model_dump(mode="json") for p in own]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-class", type=int, default=60, help="acceptance pattern: prompts per class")
    p.add_argument(
        "--candidates", type=int, default=32, help="shared cache: candidate prompts (half asked by A)"
    )
    p.add_argument(
        "--classes",
        default="copy,chat",
        help="acceptance pattern: the two prompt classes (code, chat, copy); first: the positive one",
    )
    p.add_argument("--max-tokens", type=int, default=24)
    # At least the plain decoding step of the machine under load: about 100-130 ms per token on
    # the shared 2-core CPU with one thread (the smoke runs' median), where 40 or 60 ms slipped.
    p.add_argument("--pace-ms", type=float, default=150.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench/results/side-channel.json"))
    args = p.parse_args()

    from speccore.models import load_model

    started = time.monotonic()
    target = load_model(MODEL, device="cpu", dtype="float32")
    prompts = {name: cut_prompts(target, name, args.per_class) for name in args.classes.split(",")}
    candidates = cut_prompts(target, "chat", args.candidates, skip=args.per_class)
    del target
    work = Path(tempfile.mkdtemp(prefix="side-channel-"))  # the servers' logs and the policies
    print(f"server logs in {work}", file=sys.stderr)
    policies(work / "policies.json", args.pace_ms)
    (work / "tenant.key").write_bytes(TENANT_KEY)
    common = ["--method", METHOD, "--security-policies", str(work / "policies.json")]
    common += ["--tenant-key-file", str(work / "tenant.key")]
    with server(common, "engine-a", work, args.threads) as url:
        pattern = acceptance_pattern(url, prompts, args.max_tokens, args.pace_ms)
    print(json.dumps(pattern["settings"], indent=1), file=sys.stderr)
    with server([*common, "--draft-pool"], "engine-b", work, args.threads) as url:
        cache = shared_cache(url, candidates, args.max_tokens)
    print(json.dumps(cache["settings"], indent=1), file=sys.stderr)

    def split(results: dict[str, Any]) -> tuple[float, list[float]]:
        aucs = [s["auc"] for s in results["settings"].values()]
        return aucs[0], aucs[1:]

    open_a, mitigated_a = split(pattern)
    open_b, mitigated_b = split(cache)
    result = {
        "machine": machine(),
        "model": MODEL,
        "method": METHOD,
        "threads": args.threads,
        "prompt_tokens": PROMPT_TOKENS,
        "max_tokens": args.max_tokens,
        "pace_ms": args.pace_ms,
        "acceptance_pattern": pattern,
        "shared_cache": cache,
        "goals": {
            "unmitigated_auc": {"acceptance_pattern": open_a, "shared_cache": open_b},
            "mitigated_auc_at_most": GOAL_AUC,
            "mitigated_met": all(a <= GOAL_AUC for a in (*mitigated_a, *mitigated_b)),
        },
        "seconds": round(time.monotonic() - started, 1),
        "command": "make side-channel",
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s", file=sys.stderr)
    if not result["goals"]["mitigated_met"]:
        print(f"a mitigated attack's AUC is above {GOAL_AUC}: goal not met", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
