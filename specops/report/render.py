"""The report's markdown and PNG plots (matplotlib, Agg) from `run.aggregate`'s entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specops.report import prices, stats
from specops.report.methods import baseline_of, engine_of, is_baseline
from specops_services.benchmark_runner.engine_server import HttpEngine

# A speculative method's p99 above this multiple of its engine's `none`'s at the same level is
# marked as hurting the tail (the machines' noise moves repeated ratios by a few per cent).
TAIL_HURT = 1.05


def _get(entries: list[dict[str, Any]], workload: str, c: int, method: str) -> dict[str, Any] | None:
    for e in entries:
        if (e["workload"], e["concurrency"], e["method"]) == (workload, c, method):
            return e
    return None


def _n(v: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def headline(entries: list[dict[str, Any]], workload: str, c: int, baseline: str) -> dict[str, Any] | None:
    """The fastest method measured against `baseline` at a workload and concurrency."""
    rivals = [
        e for e in entries
        if (e["workload"], e["concurrency"]) == (workload, c) and e["method"] != baseline
        and baseline_of(e["method"]) == baseline and e.get("speedup")
    ]  # fmt: skip
    return max(rivals, key=lambda e: e["speedup"], default=None)


def _command(model: str, label: str, flags: list[str]) -> str:
    if engine_of(label) == HttpEngine.VLLM:
        return f"vllm serve <{model}'s checkpoint> {' '.join(flags)}"
    return f"specops serve engine --model {model} {' '.join(flags)}"


def _baselines(methods: list[str]) -> list[str]:
    return [m for m in methods if is_baseline(m)]


def markdown(report: dict[str, Any]) -> str:
    entries, spec, mach = report["entries"], report["spec"], report["machine"]
    methods = list(spec["methods"])
    lines = [
        "# Serving report: tail latency, throughput and cost through `specops serve engine`"
        + (" and vLLM" if any(engine_of(m) == HttpEngine.VLLM for m in methods) else ""),
        "",
        f"- Date: {report['machine']['date']}; commit `{report['commit']}`",
        f"- Machine: {mach['processor']}, {mach['cpus']} CPUs, {mach['platform']}; load average "
        f"before/after {_load(mach['load_average'])} / {_load(report['load_after'])} "
        "(a host shared with other agents)",
        f"- Model `{spec['model']}`, greedy, max_tokens {spec['max_tokens']}, {spec['n_prompts']} prompts "
        f"per workload, requests per level max(prompts, {spec.get('rounds', 2)} x concurrency), "
        f"{spec['reps']} rep(s) (median), "
        "methods interleaved per level, one server per method started once",
        f"- SLO for goodput: queue-inclusive TTFT <= {spec['slo']['ttft_s']} s and TPOT <= "
        f"{spec['slo']['tpot_s'] * 1000:.0f} ms",
        f"- Load generator: {report['loadgen']}",
        "",
        "```sh",
        report["command"],
        "```",
        "",
        "Methods (server flags):",
        "",
        *[f"- `{m}`: `{_command(spec['model'], m, flags)}`" for m, flags in spec["methods"].items()],
        "",
        "Latencies in ms. `x none`: throughput ratio against the method's own engine's `none` (`vllm:none` "
        "for vLLM's) at the same workload and concurrency. "
        f"**bold** p99: above {TAIL_HURT}x that `none`'s p99 at that level — speculation hurts the tail "
        "there.",
        "",
    ]  # fmt: skip
    lines += _summary(entries, spec)
    for workload in spec["workloads"]:
        lines += [
            f"## {workload}",
            "",
            "| method | conc. | tok/s | x none | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | e2e p50 "
            "| e2e p99 | goodput req/s | SLO met | accept. rate | accept. len |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in spec["concurrency"]:
            for m in methods:
                e = _get(entries, workload, c, m)
                if e is None:
                    continue
                lines.append(
                    f"| {m} | {c} | {_n(e['throughput_tok_s'], '{:.1f}')}{_failed(e)} "
                    f"| {_n(e.get('speedup'), '{:.2f}')} "
                    f"| {_n(e['p50_ttft_ms'])} | {_tail(e, 'p99_ttft_ms')} | {_n(e['p50_tpot_ms'])} "
                    f"| {_tail(e, 'p99_tpot_ms')} | {_n(e['p50_e2e_ms'])} | {_tail(e, 'p99_e2e_ms')} "
                    f"| {_n(e['goodput_req_s'], '{:.2f}')} | {_n(e['slo_attainment'], '{:.0%}')} "
                    f"| {_n(e['acceptance_rate'], '{:.2f}')} | {_n(e['mean_acceptance_length'], '{:.2f}')} |"
                )
        lines.append("")
    lines += (
        _acceptance(entries, spec, methods)
        + _tail_summary(entries, spec, methods)
        + _cost(entries, spec, methods)
    )
    lines += [
        "## Plots",
        "",
        *[f"![{name}]({Path(path).name})" for name, path in report["plots"].items()],
        "",
    ]
    return "\n".join(lines)


def _summary(entries: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """The fastest speculative method per engine, workload and concurrency, as a ratio against
    that engine's `none`."""
    lines = [
        "## Summary: fastest speculative method vs its engine's `none`",
        "",
        "| workload | against | " + " | ".join(f"conc. {c}" for c in spec["concurrency"]) + " |",
        "|---|---|" + "---|" * len(spec["concurrency"]),
    ]
    for w in spec["workloads"]:
        for baseline in _baselines(list(spec["methods"])):
            cells = []
            for c in spec["concurrency"]:
                best = headline(entries, w, c, baseline)
                cells.append("–" if best is None else f"{best['method']} {best['speedup']:.2f}x")
            lines.append(f"| {w} | {baseline} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _failed(e: dict[str, Any]) -> str:
    return f" ({e['errors']} of {e['requests']} failed)" if e.get("errors") else ""


def _load(load: list[float] | tuple[float, ...]) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


def _tail(e: dict[str, Any], name: str) -> str:
    text = _n(e[name])
    ratio = e.get(f"{name}_vs_baseline")
    if not is_baseline(e["method"]) and ratio is not None and ratio > TAIL_HURT:
        return f"**{text}** ({ratio:.2f}x)"
    return text


def _acceptance(entries: list[dict[str, Any]], spec: dict[str, Any], methods: list[str]) -> list[str]:
    spec_methods = [m for m in methods if not is_baseline(m)]
    lines = [
        "## Acceptance per distribution",
        "",
        "From the server's `specops:spec_decode_*` counter deltas over each level (median over levels): "
        "accepted / draft tokens, and mean acceptance length (1 + accepted per drafting step).",
        "",
        "| workload | " + " | ".join(spec_methods) + " |",
        "|---|" + "---:|" * len(spec_methods),
    ]
    for w in spec["workloads"]:
        cells = []
        for m in spec_methods:
            rates = [
                e["acceptance_rate"]
                for e in entries
                if e["workload"] == w and e["method"] == m and e["acceptance_rate"] is not None
            ]
            lens = [
                e["mean_acceptance_length"]
                for e in entries
                if e["workload"] == w and e["method"] == m and e["mean_acceptance_length"] is not None
            ]
            cells.append(f"{_n(stats.median(rates), '{:.2f}')} / {_n(stats.median(lens), '{:.2f}')}")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _tail_summary(entries: list[dict[str, Any]], spec: dict[str, Any], methods: list[str]) -> list[str]:
    lines = [
        "## p99 with and without speculation",
        "",
        "p99 TPOT / TTFT in ms, each speculative method against its engine's `none` at each concurrency.",
        "",
        "| workload | conc. | method | TPOT p99 | its `none`'s | TTFT p99 | its `none`'s |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for w in spec["workloads"]:
        for c in spec["concurrency"]:
            for m in methods:
                e = _get(entries, w, c, m)
                base = _get(entries, w, c, baseline_of(m))
                if is_baseline(m) or e is None or base is None:
                    continue
                lines.append(
                    f"| {w} | {c} | {m} | {_tail(e, 'p99_tpot_ms')} | {_n(base['p99_tpot_ms'])} "
                    f"| {_tail(e, 'p99_ttft_ms')} | {_n(base['p99_ttft_ms'])} |"
                )
    return [*lines, ""]


def _cost(entries: list[dict[str, Any]], spec: dict[str, Any], methods: list[str]) -> list[str]:
    top = max(spec["concurrency"])
    cpu = prices.CPU
    lines = [
        "## Cost per 1M output tokens",
        "",
        f"This CPU priced as {cpu.hardware} at ${cpu.low_usd_h:.4f}/h ({cpu.note}; "
        f"source {cpu.source}, {cpu.date}), "
        f"at each method's measured throughput at concurrency {top}:",
        "",
        "| workload | " + " | ".join(methods) + " |",
        "|---|" + "---:|" * len(methods),
    ]
    for w in spec["workloads"]:
        cells = []
        for m in methods:
            e = _get(entries, w, top, m)
            cost = (
                stats.cost_per_million(cpu.low_usd_h, e["throughput_tok_s"])
                if e and e["throughput_tok_s"]
                else None
            )
            cells.append(_n(cost, "${:.2f}"))
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Published API prices per 1M output tokens, and the output tokens/s a GPU (hourly price range) must "
        "sustain to match each — GPU throughput is not measured in this CPU run:",
        "",
        "| API | $/1M out | source (date) | " + " | ".join(g.hardware for g in prices.GPUS) + " |",
        "|---|---:|---|" + "---:|" * len(prices.GPUS),
    ]
    for api in prices.APIS:
        cells = [
            f"{stats.break_even_tok_s(g.low_usd_h, api.output_usd_per_million):,.0f}–"
            f"{stats.break_even_tok_s(g.high_usd_h, api.output_usd_per_million):,.0f} tok/s"
            for g in prices.GPUS
        ]
        lines.append(
            f"| {api.model} | ${api.output_usd_per_million:.2f} | {api.source} ({api.date}) | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "GPU prices: "
        + "; ".join(
            f"{g.hardware} ${g.low_usd_h:.2f}–{g.high_usd_h:.2f}/h ({g.note}; {g.source}, {g.date})"
            for g in prices.GPUS
        )
        + ".",
        "",
    ]
    return lines


def plots(entries: list[dict[str, Any]], spec: dict[str, Any], out_prefix: Path) -> dict[str, str]:
    """Throughput vs concurrency, p99 TTFT/TPOT vs concurrency, speedup vs each engine's none;
    {name: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads, methods, levels = spec["workloads"], list(spec["methods"]), spec["concurrency"]
    paths: dict[str, str] = {}

    def series(w: str, m: str, key: str) -> list[float]:
        return [
            float("nan") if (e := _get(entries, w, c, m)) is None or e.get(key) is None else e[key]
            for c in levels
        ]

    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for m in methods:
            ax.plot(levels, series(w, m, "throughput_tok_s"), marker="o", label=m)
        ax.set(title=w, xlabel="concurrency", ylabel="output tokens/s", xscale="log", xticks=levels)
        ax.set_xticklabels([str(c) for c in levels])
    axes[0][0].legend(fontsize=8)
    paths["throughput vs concurrency"] = _save(fig, out_prefix, "throughput")

    fig, axes = plt.subplots(2, len(workloads), figsize=(4.2 * len(workloads), 6.4), squeeze=False)
    for col, w in enumerate(workloads):
        for row, (key, label) in enumerate(
            (("p99_tpot_ms", "p99 TPOT (ms)"), ("p99_ttft_ms", "p99 TTFT (ms)"))
        ):
            ax = axes[row][col]
            for m in methods:
                ax.plot(
                    levels, series(w, m, key), marker="o", label=m, linestyle="--" if is_baseline(m) else "-"
                )
            ax.set(title=w, xlabel="concurrency", ylabel=label, xscale="log", xticks=levels)
            ax.set_xticklabels([str(c) for c in levels])
    axes[0][0].legend(fontsize=8)
    paths["p99 TPOT and TTFT vs concurrency"] = _save(fig, out_prefix, "p99")

    spec_methods = [m for m in methods if not is_baseline(m)]
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False, sharey=True
    )
    width = 0.8 / max(len(spec_methods), 1)
    for ax, w in zip(axes[0], workloads, strict=True):
        for i, m in enumerate(spec_methods):
            xs = [j + i * width for j in range(len(levels))]
            ax.bar(xs, [0 if v != v else v for v in series(w, m, "speedup")], width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], [str(c) for c in levels])
        ax.set(title=w, xlabel="concurrency", ylabel="throughput / its engine's none")
    axes[0][0].legend(fontsize=8)
    paths["speedup vs none"] = _save(fig, out_prefix, "speedup")
    return paths


def _save(fig: Any, prefix: Path, name: str) -> str:
    path = prefix.with_name(f"{prefix.name}-{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)
