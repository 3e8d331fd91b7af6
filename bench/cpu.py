"""Plain and speculative decoding on this CPU against the stacks users already have:
`make bench-cpu`.

One file per host class, ``bench/results/cpu-<host>.json`` (and ``docs/results/cpu.md``):

- the host: CPU model, the instruction-set flags speccore's kernels dispatch on, threads,
  the read bandwidth measured here and the plain-decoding limit it sets;
- per workload (chat, code, agentic), greedy, smollm2-135m in float32, one interleaved run
  (``speccore.bench``): HF ``generate``, HF prompt lookup, speccore none / ngram / suffix /
  EAGLE (the shipped head), every ratio against speccore ``none`` in the same reps and every
  output compared with ``none``'s, token for token;
- vLLM's CPU build on the same prompts (none / ngram / suffix, a server each, as
  ``bench/engines.py`` runs it), unless ``--no-vllm`` (with ``--only``, the file's earlier
  vLLM rows are kept, dated);
- bfloat16: speccore ``none`` and HF ``generate`` in bfloat16 on chat (outputs compared
  with bfloat16 ``none``), beside float32 ``none`` of the same prompts;
- a profile of a float32 decoding step: the decoder forward, the output projection, the
  rest, and each kind of matmul alone with the bandwidth it streams at; then steps against
  the read bandwidth measured between them, and with the weights on huge pages (as
  loaded) against 4 KiB pages;
- the OpenMP wait policy: speccore ``none`` in processes started with the default policy
  and with ``OMP_WAIT_POLICY=PASSIVE`` (how the services run), alternated.

    .venv/bin/python bench/cpu.py            # about 40 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import machine
from engines import vllm_side

from speccore import cpu_kernels, hugepages, native_kernels
from speccore.bandwidth import decode_limit_tokens_per_s, measure_read_bandwidth
from speccore.bench import BenchSpec, run_bench
from speccore.models import LoadedModel, load_model
from speccore.runner import ModelRunner
from specplatform import engines
from specprompts.sets import load_prompts

MODEL = "smollm2-135m-instruct"
WORKLOADS = ("chat", "code", "agentic")
# `specops bench` method names -> the names in the results.
METHODS = {
    "hf": "hf_generate",
    "hf_prompt_lookup": "hf_prompt_lookup",
    "none": "none",
    "ngram": "ngram",
    "suffix": "suffix",
    "eagle": "eagle",
}
HEADS = ("builtin:eagle",)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def host() -> dict[str, Any]:
    flags = set(native_kernels.cpu_flags().split())
    model = native_kernels.cpu_info("model name") or platform.processor() or platform.machine()
    isa = {flag: flag in flags for flag in ISA_FLAGS}
    return {"cpu": model, "isa": isa, "native_lanes": native_kernels.lanes()}


def host_label(facts: dict[str, Any]) -> str:
    """e.g. ``epyc-avx2``, ``xeon-amx``: the CPU family and the widest ISA the kernels use."""
    words = [w.lower() for w in facts["cpu"].replace("(R)", "").replace("(TM)", "").split()]
    family = next((w for w in words if w in ("epyc", "xeon", "ryzen", "core")), words[0] if words else "cpu")
    isa = facts["isa"]
    widest = "amx" if isa["amx_tile"] else "avx512" if isa["avx512f"] else "avx2" if isa["avx2"] else "base"
    return f"{family}-{widest}"


def speccore_rows(result: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for method, r in result["methods"].items():
        # speccore's: one verify step (forward, logits, verification), prefill excluded
        steps = r.get("verify_steps")
        step = {"verify_step_ms": 1e3 * r["verify_time_s"] / steps} if steps else {}
        rows[METHODS.get(method, method)] = step | {
            "tokens_per_s": r["tokens_per_s_median"],
            "vs_speccore_none": r["speedup_vs_none"],
            "mean_acceptance_length": r.get("mean_acceptance_length"),
            "identical_to_none": r.get("identical_to_baseline"),
        }
    return rows | ({"failures": result["failures"]} if result.get("failures") else {})


def measure(
    target: LoadedModel, workload: str, methods: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    dtype = str(target.dtype).removeprefix("torch.")
    spec = BenchSpec(
        workload=workload,
        methods=methods,
        n_prompts=args.n_prompts,
        max_new_tokens=args.max_new_tokens,
        reps=args.reps,
        heads=HEADS if "eagle" in methods else (),
    )
    prompts = load_prompts(workload, args.n_prompts, 0)
    return run_bench(target, spec, prompts, log=lambda m: print(f"  {dtype} {workload} {m}", flush=True))


def bfloat16(fp32_target: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """bfloat16 none and HF generate in one interleaved run, float32 none in the next (one
    run measures one target's dtype)."""
    bf16_target = load_model(MODEL, device="cpu", dtype="bfloat16")
    bf16 = speccore_rows(measure(bf16_target, "chat", ["none", "hf"], args))
    fp32 = speccore_rows(measure(fp32_target, "chat", ["none"], args))["none"]
    return {
        "workload": "chat",
        "rows": bf16,
        "float32_none": fp32,
        "none_vs_float32_none": bf16["none"]["tokens_per_s"] / fp32["tokens_per_s"],
        "decode_vs_float32_decode": fp32["verify_step_ms"] / bf16["none"]["verify_step_ms"],
    }


@torch.inference_mode()
def profile(target: LoadedModel, steps: int = 64, warmup: int = 16) -> dict[str, Any]:
    """Where a float32 decoding step's time goes (median ms of ``steps`` steps after a
    250-token prefill): the decoder forward (one native call), the output projection, the
    rest; then each kind of matmul alone (one call per layer), with the bytes it streams."""
    runner = ModelRunner(target.model)
    lean = runner.lean
    if lean is None:
        return {"skipped": "no lean decoder on this host (native kernels not built)"}
    cache = runner.new_cache(1, 2048)
    token = runner.logits(runner.forward(cache, torch.randint(100, 30000, (1, 250)))[:, -1:]).argmax(-1)
    cache.commit(torch.tensor([250]))
    parts: dict[str, list[float]] = {"step": [], "forward": [], "output_projection": []}
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        hidden = runner.forward(cache, token)
        t1 = time.perf_counter()
        logits = runner.logits(hidden)
        t2 = time.perf_counter()
        token = logits.argmax(-1)
        cache.commit(torch.tensor([1]))
        t3 = time.perf_counter()
        if i >= warmup:
            for part, seconds in (("step", t3 - t0), ("forward", t1 - t0), ("output_projection", t2 - t1)):
                parts[part].append(seconds)
    ms = {part: statistics.median(v) * 1e3 for part, v in parts.items()}
    layer_bytes = sum(p.nbytes for p in lean.packed)
    head: Any = runner.head
    head_bytes = head.packed.nbytes
    result: dict[str, Any] = {
        "ms": ms | {"rest": ms["step"] - ms["forward"] - ms["output_projection"]},
        "forward_gb_s": layer_bytes / ms["forward"] / 1e6,
        "output_projection_gb_s": head_bytes / ms["output_projection"] / 1e6,
        "matmuls_alone": {},
    }
    native, layers = lean.native, len(lean.layers)
    for j, name in enumerate(("qkv", "o_proj", "gate_up", "down_proj")):
        weights = lean.packed[j::4]
        rows = torch.randn(1, weights[0].shape[1] * native.lanes)
        times = []
        for _ in range(warmup + 16):
            t0 = time.perf_counter()
            for w in weights:
                native.linear(rows, w, lean.out_features[j], None)
            times.append(time.perf_counter() - t0)
        seconds = statistics.median(times[warmup:])
        streamed = sum(w.nbytes for w in weights)
        result["matmuls_alone"][name] = {
            "ms": seconds * 1e3,
            "gb_s": streamed / seconds / 1e9,
            "layers": layers,
        }
    return result | against_stream(runner, cache, token)


def _steps(runner: ModelRunner, cache: Any, token: torch.Tensor, n: int) -> tuple[float, torch.Tensor]:
    """Seconds a greedy decoding step over ``n`` steps, and the last token."""
    started = time.perf_counter()
    for _ in range(n):
        token = runner.logits(runner.forward(cache, token)).argmax(-1)
        cache.commit(torch.tensor([1]))
    return (time.perf_counter() - started) / n, token


@torch.inference_mode()
def against_stream(
    runner: ModelRunner, cache: Any, token: torch.Tensor, rounds: int = 24, n: int = 4
) -> dict[str, Any]:
    """Decoding steps against the host's read bandwidth measured between them (its load
    drifts within minutes), and the steps with their weights on huge pages (as loaded,
    ``speccore.hugepages``) against a copy on ordinary 4 KiB pages; interleaved rounds,
    medians of per-round ratios."""
    lean, head = runner.lean, runner.head
    assert lean is not None and isinstance(head, cpu_kernels.PackedLinear)
    huge = (list(lean.packed), head.packed)
    small = ([w.clone() for w in huge[0]], huge[1].clone())  # PyTorch's allocator: 4 KiB pages
    weight_bytes = sum(w.nbytes for w in huge[0]) + huge[1].nbytes
    buffer = hugepages.empty(1 << 27, torch.float32).fill_(1.0)
    rows: dict[str, list[float]] = {"step": [], "step_4k": [], "stream": []}
    with runner.small_ops(1):
        for i in range(rounds + 2):
            lean.packed, head.packed = huge
            step, token = _steps(runner, cache, token, n)
            lean.packed, head.packed = small
            step_4k, token = _steps(runner, cache, token, n)
            started = time.perf_counter()
            buffer.sum()
            stream = time.perf_counter() - started
            if i >= 2:
                for key, value in (("step", step), ("step_4k", step_4k), ("stream", stream)):
                    rows[key].append(value)
    lean.packed, head.packed = huge
    bandwidth = [buffer.nbytes / s for s in rows["stream"]]
    return {
        "against_stream": {
            "weight_bytes": weight_bytes,
            "step_ms": statistics.median(rows["step"]) * 1e3,
            "read_bandwidth_gb_s": statistics.median(bandwidth) / 1e9,
            # the step's rate of weight bytes over the bandwidth measured in the same round
            "fraction_of_limit": statistics.median(
                weight_bytes / step / b for step, b in zip(rows["step"], bandwidth, strict=True)
            ),
            "huge_pages_vs_4k_pages": statistics.median(
                four_k / on_huge for four_k, on_huge in zip(rows["step_4k"], rows["step"], strict=True)
            ),
            "transparent_hugepages": hugepages.policy(),
            "rounds": rounds,
            "steps_per_round": n,
        }
    }


def wait_policies(args: argparse.Namespace) -> dict[str, Any]:
    """speccore none under each OpenMP wait policy (read when a process starts), alternated."""
    runs: dict[str, list[float]] = {"default": [], "passive": []}
    for _ in range(args.policy_rounds):
        for policy in runs:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy == "passive":
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "none.json"
                command = [
                    str(Path(sys.executable).with_name("specops")), "bench", "--model", MODEL,
                    "--threads", str(args.threads), "--workload", "chat", "--methods", "none",
                    "--n-prompts", str(args.n_prompts), "--reps", str(args.reps),
                    "--max-new-tokens", str(args.max_new_tokens), "--out", str(out),
                ]  # fmt: skip
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                tps = json.loads(out.read_text())["methods"]["none"]["tokens_per_s_median"]
            print(f"  wait policy {policy}: none {tps:.1f} tok/s", flush=True)
            runs[policy].append(tps)
    default, passive = statistics.median(runs["default"]), statistics.median(runs["passive"])
    return {"none_tokens_per_s": runs, "passive_vs_default": passive / default}


def summary(out: dict[str, Any]) -> dict[str, Any]:
    """The numbers the issue's acceptance names, from the rows above."""
    rows = out["workloads"]
    limit = out["plain_decoding_limit"]["tokens_per_s"]
    none = {w: r["speccore"]["none"]["tokens_per_s"] for w, r in rows.items()}
    ratio = {w: {m: row["vs_speccore_none"] for m, row in r["speccore"].items() if isinstance(row, dict)}
             for w, r in rows.items()}  # fmt: skip
    result: dict[str, Any] = {
        "none_vs_hf_generate": {w: 1 / r["hf_generate"] for w, r in ratio.items()},
        "none_fraction_of_limit": {w: tps / limit for w, tps in none.items()},
        # decoding alone: one token per verify step of none, prefill excluded
        "none_decode_fraction_of_limit": {
            w: 1e3 / r["speccore"]["none"]["verify_step_ms"] / limit
            for w, r in rows.items()
            if "verify_step_ms" in r["speccore"]["none"]
        },
        "ngram_vs_hf_prompt_lookup": {w: r["ngram"] / r["hf_prompt_lookup"] for w, r in ratio.items()},
        "speccore_outputs_identical_to_none": all(
            m.get("identical_to_none") is True
            for r in rows.values()
            for name, m in r["speccore"].items()
            if isinstance(m, dict) and not name.startswith("hf")
        ),
        "hf_outputs_identical_to_speccore_none": {
            w: {n: m.get("identical_to_none") for n, m in r["speccore"].items() if n.startswith("hf")}
            for w, r in rows.items()
        },
    }
    if "bfloat16" in out:
        result["bf16_none_vs_fp32_none"] = out["bfloat16"]["none_vs_float32_none"]
        result["bf16_decode_vs_fp32_decode"] = out["bfloat16"].get("decode_vs_float32_decode")
    if "wait_policy" in out:
        result["passive_vs_default"] = out["wait_policy"]["passive_vs_default"]
    if "against_stream" in out.get("profile", {}):
        stream = out["profile"]["against_stream"]
        result["decode_step_fraction_of_limit_same_rounds"] = stream["fraction_of_limit"]
        result["huge_pages_vs_4k_pages"] = stream["huge_pages_vs_4k_pages"]
    return result


def markdown(out: dict[str, Any], path: Path) -> str:
    date = out["machine"]["date"]
    vllm_dates = sorted({str(w.get("vllm_measured", date)) for w in out["workloads"].values()})
    speccore_dates = sorted({str(w.get("speccore_measured", date)) for w in out["workloads"].values()})
    part_dates = {p: out[p].get("measured", date) for p in ("bfloat16", "profile", "wait_policy") if p in out}
    lines = [
        f"# CPU decoding on {out['host']['cpu']} ({out['host_label']})",
        "",
        f"**Measured:** {date}, on the shared 2-core CPU machines.  ",
        f"**Reproduce:** `make bench-cpu` (`{out['command']}`)  ",
        *[f"**Re-measured:** {r['date']}: `{r['command']}`  " for r in out.get("reruns", [])],
        f"**Results:** `{path}` (in the repository).",
        "",
        f"{out['settings']['threads']} threads, smollm2-135m-instruct, greedy, "
        f"{out['settings']['max_new_tokens']} new tokens, {out['settings']['n_prompts']} prompts, "
        f"{out['settings']['reps']} interleaved reps; tok/s include prefill. Read bandwidth "
        f"{out['plain_decoding_limit']['read_bandwidth_gb_s']:.1f} GB/s: float32 plain decoding "
        f"cannot pass {out['plain_decoding_limit']['tokens_per_s']:.1f} tok/s. How to read these "
        "numbers (host drift, neighbours' load): [Results](index.md).",
        "",
        "| workload | engine | method | tok/s | vs none | MAL | identical to none |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for workload, both in out["workloads"].items():
        for engine in ("speccore", "vllm"):
            for method, r in both.get(engine, {}).items():
                if not isinstance(r, dict) or "tokens_per_s" not in r:
                    continue
                ratio = r.get("vs_speccore_none", r.get("speedup"))
                mal = r.get("mean_acceptance_length") if method != "none" else None
                lines.append(
                    f"| {workload} | {engine if 'hf' not in method else 'transformers'} | {method} | "
                    f"{r['tokens_per_s']:.1f} | {ratio:.2f}x | {'' if mal is None else f'{mal:.2f}'} | "
                    f"{r.get('identical_to_none', '')} |"
                )
    lines += [
        "",
        "`vs none` is against speccore's `none` in the same reps for the speccore and transformers",
        "rows, against vLLM's own `none` for vLLM's. vLLM's suffix decoding keeps earlier requests'",
        "outputs in a global cache: in the second rep it drafts from the first rep's identical",
        "answers, so its suffix rows overstate what new traffic gets (speccore's suffix here",
        "drafts from the request alone). MAL is tokens per verify step.",
        "",
        f"Measured: vLLM's rows {', '.join(vllm_dates)}; speccore's and transformers' rows "
        f"{', '.join(speccore_dates)}; "
        + "; ".join(f"{part} {when}" for part, when in part_dates.items())
        + ".",
        "",
    ]
    if "profile" in out and "ms" in out["profile"]:
        prof = out["profile"]
        lines += ["## A float32 decoding step", "", "| part | ms | streams at |", "|---|---:|---:|"]
        rates = {part: f"{prof[part + '_gb_s']:.1f} GB/s" for part in ("forward", "output_projection")}
        lines += [f"| {part} | {ms:.2f} | {rates.get(part, '')} |" for part, ms in prof["ms"].items()]
        lines += [f"| {name} alone ({m['layers']} layers) | {m['ms']:.2f} | {m['gb_s']:.1f} GB/s |"
                  for name, m in prof["matmuls_alone"].items()]  # fmt: skip
        lines.append("")
        if "against_stream" in prof:
            st = prof["against_stream"]
            lines += [
                f"Against the read bandwidth measured between the steps ({st['rounds']} interleaved "
                f"rounds): a step of {st['step_ms']:.2f} ms streams its {st['weight_bytes'] / 1e6:.0f} MB "
                f"of weights at {st['fraction_of_limit']:.2f} of {st['read_bandwidth_gb_s']:.1f} GB/s. "
                "With the weights on ordinary 4 KiB pages instead of huge pages a step takes "
                f"{st['huge_pages_vs_4k_pages']:.2f}x as long (transparent huge pages: "
                f"`{st['transparent_hugepages']}`).",
                "",
            ]
    lines += [
        "## Summary",
        "",
    ]
    lines += [f"- {k}: {json.dumps(v)}" for k, v in out["summary"].items()]
    return "\n".join(lines + other_runs(path)) + "\n"


def other_runs(path: Path) -> list[str]:
    """The committed runs of other files (other host classes, earlier full runs), headline
    ratios only: each file holds the rest."""
    lines = ["", "## Other runs", "", "| file | CPU | measured | none vs HF generate | "
             "ngram vs HF prompt lookup | PASSIVE vs default |", "|---|---|---|---|---|---:|"]  # fmt: skip
    for other in sorted(path.parent.glob("cpu-*.json")):
        if other.resolve() == path.resolve():
            continue
        run = json.loads(other.read_text())
        ratios = run.get("summary", {})

        def per_workload(key: str, ratios: dict[str, Any] = ratios) -> str:
            return ", ".join(f"{w} {v:.2f}x" for w, v in ratios.get(key, {}).items())

        passive = ratios.get("passive_vs_default")
        lines.append(
            f"| `{other}` | {run['host']['cpu']} ({run['host_label']}) | {run['machine']['date'][:16]} | "
            f"{per_workload('none_vs_hf_generate')} | {per_workload('ngram_vs_hf_prompt_lookup')} | "
            f"{'' if passive is None else f'{passive:.2f}'} |"
        )
    return lines if len(lines) > 5 else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: bench/results/cpu-<host>.json")
    parser.add_argument("--docs", type=Path, default=Path("docs/results/cpu.md"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--n-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--policy-rounds", type=int, default=2)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--only",
        help="comma-separated parts to measure again (workloads, bfloat16, profile, wait_policy); the "
        "others are kept from the existing --out file",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    facts = host()
    label = host_label(facts)
    path = args.out or Path(f"bench/results/cpu-{label}.json")
    vllm = engines.state("vllm")
    if not args.no_vllm and not vllm.runnable:
        parser.error(f"{vllm.reason}; run `{vllm.install_command}` first, or pass --no-vllm")
    given = " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items()
        if v not in (None, False)
    )
    command = f"python bench/cpu.py {given}"
    settings = vars(args) | {"out": str(path), "docs": str(args.docs), "greedy": True}
    target = load_model(MODEL, device="cpu", dtype="float32")
    parts = set(args.only.split(",")) if args.only else {"workloads", "bfloat16", "profile", "wait_policy"}
    kept: dict[str, Any] = json.loads(path.read_text()) if args.only and path.exists() else {}
    out: dict[str, Any] = kept | {
        "command": kept.get("command", command),  # the run whose rows the file holds
        "machine": machine(),
        "host": facts,
        "host_label": label,
        "model": MODEL,
        "settings": kept.get("settings", settings),
        "workloads": kept.get("workloads", {}),
    }
    if args.only:
        out["reruns"] = kept.get("reruns", []) + [{"command": command, "date": out["machine"]["date"]}]
    if "workloads" in parts or "plain_decoding_limit" not in out:
        # the limit the workloads' rows are read against: measured with them
        bandwidth = measure_read_bandwidth()
        out["plain_decoding_limit"] = {
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "weight_bytes": target.weight_bytes,
            "tokens_per_s": decode_limit_tokens_per_s(target.weight_bytes, bandwidth),
        }

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")

    for workload in args.workloads.split(",") if "workloads" in parts else ():
        started = time.monotonic()
        rows: dict[str, Any] = {"speccore": speccore_rows(measure(target, workload, list(METHODS), args))}
        if not args.no_vllm:
            rows["vllm"] = vllm_side(workload, args.n_prompts, args.max_new_tokens, args.reps, args.threads)
            rows["vllm_measured"] = out["machine"]["date"]
        elif "vllm" in kept.get("workloads", {}).get(workload, {}):
            # vLLM's rows are its own ratios, untouched by speccore's changes: kept, with their date
            before = kept["workloads"][workload]
            rows["vllm"] = before["vllm"]
            rows["vllm_measured"] = before.get("vllm_measured", kept["machine"]["date"])
        rows["speccore_measured"] = out["machine"]["date"]
        out["workloads"][workload] = rows | {"seconds": time.monotonic() - started}
        save()
    if "bfloat16" in parts:
        out["bfloat16"] = bfloat16(target, args) | {"measured": out["machine"]["date"]}
        save()
    if "profile" in parts:
        out["profile"] = profile(target) | {"measured": out["machine"]["date"]}
        save()
    if "wait_policy" in parts:
        out["wait_policy"] = wait_policies(args) | {"measured": out["machine"]["date"]}
    out["summary"] = summary(out)
    save()
    args.docs.parent.mkdir(parents=True, exist_ok=True)
    args.docs.write_text(markdown(out, path))
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
