"""`specops run`: start a T1 run through the gateway, follow its events, print the winner.

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`.
Progress goes to stderr, one line per event; the winner and candidates tables (or, with
`--json`, the final RunStatusResponse as one JSON line, then with `--apply` what `specops
apply --json` prints: the ApplyResponse's fields and `launch`) go to stdout.

Exit codes: 0 the run completed (with or without a winner; a tenant that opted out of
speculation gets no winner, and the reason); 1 the run failed; 2 it could
not be submitted or followed (no gateway, bad token, invalid request: one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from speccatalog.fingerprint import SampleError, read_samples
from specops.client import Run, RunEvent, SpecopsError, SpeculativeClient
from specops.commands import client_command
from specops.commands.apply import apply_text, apply_view
from specops.commands.tables import table
from specops_schemas.api import ApplyResponse
from specops_schemas.candidates import BASELINE_ID, Candidate, CandidateResult, GateOutcome
from specops_schemas.catalog import Engine, Fingerprint, GateMethod, Mode, RunStatus
from specops_schemas.events import (
    BenchCompleted,
    BenchRepMeasured,
    BenchRequested,
    GateEvaluated,
    RunCompleted,
    RunFailed,
    RunPredicted,
    RunQueued,
    RunRunning,
)

EXIT_FAILED = 1
TOP_PREDICTED = 3


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "run",
        help="start a T1 run through the gateway, follow its events, print the winner",
        description="Submit (target, GPU, engine, workload) to the gateway of `specops up` (or --url), "
        "show each event until the run completes, then the winner and the candidates table.",
    )
    p.add_argument("--model", required=True, help="target: Hugging Face id, local directory or alias")
    p.add_argument("--gpu", required=True, help="hardware profile, e.g. cpu or H100-80GB")
    p.add_argument("--engine", required=True, choices=[e.value for e in Engine])
    p.add_argument("--engine-version", help="engine version (default: the one installed where it runs)")
    p.add_argument(
        "--fingerprint",
        required=True,
        choices=[*Fingerprint, "auto"],
        help="workload; auto: the gateway infers it from --samples, or without them from the "
        "endpoint's live traffic (ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT)",
    )
    p.add_argument(
        "--samples",
        type=Path,
        help="with --fingerprint auto: a JSON Lines file of sample requests, as `specops fingerprint` reads",
    )
    p.add_argument(
        "--quality-gate",
        choices=[g.value for g in GateMethod if g != GateMethod.PENDING],
        help="gate method (default topk5)",
    )
    p.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.INTERACTIVE.value)
    p.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    p.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token file)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print only the final run as JSON (and, with --apply, the flags as a second JSON line)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="also print the winner's engine flags and launch command, as `specops apply --run` does",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """The `specops run` handler: the exit code; errors are printed as one line."""
    hint = (
        "; pass --token or set SPECOPS_TOKEN (create one with "
        "`specops tokens create --tenant T --role developer`)"
    )
    return client_command.call("run", args, _follow, unauthorized_hint=hint)


def _follow(client: SpeculativeClient, args: argparse.Namespace) -> int:
    say = client_command.progress(args.json)
    target = {"model_ref": args.model, "gpu": args.gpu, "engine": args.engine}
    if args.engine_version:
        target["engine_version"] = args.engine_version
    goal = {"quality_gate": args.quality_gate} if args.quality_gate else None
    start = time.monotonic()
    created = client.runs.create(target=target, workload=_workload(args), mode=args.mode, goal=goal)
    say(f"run {created.id} submitted to {client.base_url} ({(time.monotonic() - start) * 1000:.0f} ms)")
    for event in client.runs.stream(created.id):
        say(f"[{time.monotonic() - start:6.1f}s] {describe_event(event)}")
    final = client.runs.get(created.id)
    applied = _apply(client, final, say) if args.apply else None
    view = apply_view(applied, args.model) if applied is not None else None
    if args.json:
        print(final.model_dump_json())
        if view is not None:
            print(json.dumps(view))
    else:
        print(run_tables(final))
        if view is not None:
            print(apply_text(view))
    return EXIT_FAILED if final.status == RunStatus.FAILED else 0


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The request's workload; with `auto`, the samples file's texts (SpecopsError if unreadable)."""
    if args.samples is None:
        return {"fingerprint": args.fingerprint}
    try:
        with args.samples.open(encoding="utf-8") as fp:
            samples = read_samples(fp, str(args.samples))
    except (OSError, SampleError) as exc:
        raise SpecopsError(str(exc)) from None
    return {"fingerprint": args.fingerprint, "samples": samples}


def _apply(client: SpeculativeClient, final: Run, say: client_command.Say) -> ApplyResponse | None:
    if final.speculation_disabled is not None:
        say(f"nothing to apply: {final.speculation_disabled}")
        return None
    if final.winner is None:
        say("nothing to apply: the run has no winner")
        return None
    return client.runs.apply(final.id)


# --- one line per event -----------------------------------------------------------------------


def describe_event(event: RunEvent) -> str:
    """A one-line account of a run event, for progress output."""
    p = event.payload
    if isinstance(p, RunQueued):
        return "queued"
    if isinstance(p, RunRunning):
        return f"running: {p.stage}"
    if isinstance(p, RunPredicted):
        top = ", ".join(
            f"{r.candidate.candidate_id} {r.prediction.speedup:.2f}x "
            f"(acceptance {r.prediction.acceptance_rate:.2f})"
            for r in p.candidates[:TOP_PREDICTED]
        )
        line = f"predicted {len(p.candidates)} candidates; top: {top}"
        # A target the requested GPUs cannot hold is planned on another deployment: say which.
        return line if p.fit is None or p.fit.fits_as_requested else f"{line}\n  fit: {p.fit.summary}"
    if isinstance(p, BenchRequested):
        plan = p.plan
        return (
            f"measuring {len(plan.candidates)} candidates and the baseline: {plan.reps} reps x "
            f"{plan.n_prompts} prompts x {plan.max_new_tokens} tokens ({plan.fingerprint}, {plan.target.gpu})"
        )
    if isinstance(p, BenchRepMeasured):
        m = p.metrics
        head = f"rep {p.rep + 1}/{p.reps} {p.candidate_id}: {m.tokens_per_s:.1f} tok/s"
        if p.candidate_id == BASELINE_ID or p.speedup is None:
            return head
        return (
            f"{head}, {p.speedup:.2f}x, acceptance {m.acceptance_rate:.2f}, "
            f"mean acceptance length {m.mean_acceptance_length:.2f}"
        )
    if isinstance(p, BenchCompleted):
        failed = f", {len(p.failures)} failed" if p.failures else ""
        return f"measured {len(p.results)} candidates{failed}"
    if isinstance(p, GateEvaluated):
        return f"gate {p.candidate_id}: {gate_text(p)}"
    if isinstance(p, RunCompleted):
        if p.speculation_disabled is not None:
            return f"completed without speculation: {p.speculation_disabled}"
        if p.winner is None:
            return "completed: no candidate beats the baseline" + (" (cache hit)" if p.cache_hit else "")
        how = "cache hit" if p.cache_hit else ("measured" if p.measured else "predicted, not measured here")
        return f"completed: winner {p.winner.candidate.candidate_id} ({how})"
    if isinstance(p, RunFailed):
        return f"failed at {p.error_stage}: {p.message}"
    return event.type


def gate_text(gate: GateOutcome) -> str:
    if gate.passed is None:
        return f"{gate.method} pending"
    verdict = "pass" if gate.passed else "FAIL"
    if gate.score is None:
        return f"{gate.method} {verdict}"
    bound = f", threshold {gate.threshold:g}" if gate.threshold is not None else ""
    return f"{gate.method} {verdict} (score {gate.score:.3g}{bound})"


# --- the winner and the candidates table ---------------------------------------------------------


def run_tables(run: Run) -> str:
    """The winner (family, k, draft, speedup, acceptance, MAL, gate, cache hit) and every candidate."""
    lines = [f"run {run.id}: {run.status}"]
    if run.status == RunStatus.FAILED and run.error is not None:
        lines.append(f"failed at {run.error.error_stage}: {run.error.message}")
        return "\n".join(lines)
    if run.speculation_disabled is not None:
        lines.append(f"no winner: {run.speculation_disabled}")
    elif run.winner is None:
        lines.append("no winner: no qualified candidate beats plain decoding")
    else:
        lines.append("")
        lines.extend(f"{name:<24} {value}" for name, value in _winner_fields(run, run.winner))
    if run.candidates:
        lines.append("")
        lines.extend(_candidates_table(run))
    return "\n".join(lines)


def _winner_fields(run: Run, w: CandidateResult) -> list[tuple[str, str]]:
    c, m = w.candidate, w.measurement
    if m is not None:
        speedup = f"{m.speedup:.2f}x measured (predicted {w.prediction.speedup:.2f}x)"
        acceptance, mal = f"{m.acceptance_rate:.2f}", f"{m.mean_acceptance_length:.2f}"
    else:
        speedup = f"{w.prediction.speedup:.2f}x predicted (not measured here)"
        acceptance = f"{w.prediction.acceptance_rate:.2f} predicted"
        mal = f"{w.prediction.mean_acceptance_length:.2f} predicted"
    return [
        ("winner", c.candidate_id),
        ("family", str(c.family)),
        ("k", _k_text(c)),
        ("draft", c.draft or "-"),
        ("speedup", speedup),
        ("acceptance", acceptance),
        ("mean acceptance length", mal),
        ("gate", gate_text(w.gate) if w.gate is not None else "-"),
        ("cache hit", "true" if run.cache_hit else "false"),
    ]


def _k_text(c: Candidate) -> str:
    return f"{c.k} (tree {c.tree})" if c.tree else str(c.k)


def _candidates_table(run: Run) -> list[str]:
    winner = run.winner.candidate.candidate_id if run.winner is not None else None
    header = ("", "candidate", "family", "k", "draft", "predicted", "measured", "accept", "MAL", "gate")
    rows = []
    for r in run.candidates:
        c, m = r.candidate, r.measurement
        measured = f"{m.speedup:.2f}x" if m is not None else "-"
        accept = f"{m.acceptance_rate:.2f}" if m is not None else "-"
        mal = f"{m.mean_acceptance_length:.2f}" if m is not None else "-"
        gate = gate_text(r.gate) if r.gate is not None else "-"
        if r.error_stage is not None and not (r.gate is not None and r.gate.passed is False):
            gate = f"{gate}; {r.error_stage}: {r.error_message or ''}".strip("-; ")
        rows.append(
            (
                "*" if c.candidate_id == winner else "",
                c.candidate_id,
                str(c.family),
                str(c.k),
                c.draft or "-",
                f"{r.prediction.speedup:.2f}x",
                measured,
                accept,
                mal,
                gate,
            )
        )
    right = {"k", "predicted", "measured", "accept", "MAL"}
    return table(header, rows, right=right).splitlines()
