"""`specops tune`: start a T2 tune session on a completed T1 run, follow its trials, print the winner.

    specops tune --run RUN_ID --budget-minutes 20 [--reps 3] [--families ngram,lookahead]
    specops tune --session SESSION_ID        # re-attach to a session (its events from the start)

Progress goes to stderr, one line per trial
(`trial 3  ngram k=6 ngram 1-4  1.42x ± 0.05  best 1.51x (trial 1)  [12:30 of 20:00]`),
plus the space narrowing, the auto-termination and the end; the winner and its engine
flags (or, with `--json`, the final TuneSessionResponse as one JSON line) go to stdout.

Exit codes: 0 the session completed (with or without a winner); 1 it failed; 2 it could
not be submitted or followed (no gateway, bad token, invalid request: one line on stderr).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

from specops.client import RunEvent, SpeculativeClient, TuneSession
from specops.commands import client_command
from specops_schemas.candidates import Candidate
from specops_schemas.tune import (
    TrialResult,
    TuneCompleted,
    TuneFailed,
    TuneImproved,
    TuneRequested,
    TuneSpaceNarrowed,
    TuneStarted,
    TuneTerminated,
    TuneTrialCompleted,
)

EXIT_FAILED = 1


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "tune",
        help="tune a completed T1 run (T2): follow each trial, print the winner",
        description="Start a budgeted Bayesian search seeded by a completed T1 run's pareto points "
        "(or re-attach to a session with --session), show each trial until the session ends, then "
        "the winner and its engine flags.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="the completed, measured T1 run to tune")
    which.add_argument("--session", help="re-attach to this tune session instead of starting one")
    p.add_argument("--budget-minutes", type=float, help="wall-clock budget (default 60, at most 480)")
    p.add_argument("--reps", type=int, help="reps per trial (default: the host's)")
    p.add_argument("--families", help="comma-separated families the search may try (default: all feasible)")
    p.add_argument("--max-trials", type=int, help="stop after this many trials")
    p.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    p.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token file)")
    p.add_argument("--json", action="store_true", help="print only the final session as JSON")
    p.set_defaults(handler=tune)


def tune(args: argparse.Namespace) -> int:
    """The `specops tune` handler: the exit code; errors are printed as one line."""
    return client_command.call("tune", args, _follow)


def _follow(client: SpeculativeClient, args: argparse.Namespace) -> int:
    say = client_command.progress(args.json)
    if args.session:
        session_id = args.session
        say(f"following tune session {session_id}")
    else:
        families = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
        created = client.tune_sessions.create(
            run_id=args.run,
            budget_minutes=args.budget_minutes,
            reps=args.reps,
            families=families,
            max_trials=args.max_trials,
        )
        session_id = created.id
        say(f"tune session {session_id} submitted to {client.base_url}")
    progress = Progress()
    try:
        for event in client.tune_sessions.stream(session_id):
            line = progress.describe(event)
            if line is not None:
                say(line)
    except KeyboardInterrupt:
        client_command.stderr(
            f"detached; the session goes on: `specops tune --session {session_id}` re-attaches"
        )
        raise
    final = client.tune_sessions.get(session_id)
    if args.json:
        print(final.model_dump_json())
    else:
        print(session_summary(final))
        if final.winner is not None:
            applied = client.tune_sessions.apply(session_id)
            print(f"apply ({applied.config.engine}, {applied.candidate_id}): {shlex.join(applied.cli_args)}")
    return EXIT_FAILED if final.status == "failed" else 0


# --- one line per event -----------------------------------------------------------------------


def clock(seconds: float) -> str:
    """`12:30` (minutes:seconds), hours folded into the minutes."""
    whole = max(0, round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def candidate_text(c: Candidate) -> str:
    """`ngram k=6 ngram 1-4`: family, k (tree), draft, and each knob; `x_min`/`x_max` pairs as a range."""
    parts = [str(c.family), f"k={c.k}"]
    if c.tree:
        parts.append(f"tree={c.tree}")
    if c.draft:
        parts.append(c.draft)
    options = dict(c.options)
    for name in sorted(options):
        if name.endswith("_min") and f"{name[:-4]}_max" in options:
            parts.append(f"{name[:-4]} {options[name]}-{options[f'{name[:-4]}_max']}")
        elif not (name.endswith("_max") and f"{name[:-4]}_min" in options):
            parts.append(f"{name}={options[name]}")
    return " ".join(parts)


def trial_speed(t: TrialResult, *, sigma: bool = True) -> str:
    """`1.42x ± 0.05`: the mean per-rep speedup and its sigma (the value when there is no speedup)."""
    if t.speedup is None:
        return f"value {t.value:.3g}" if t.value is not None else "-"
    if not sigma or t.speedup_stdev is None:
        return f"{t.speedup:.2f}x"
    return f"{t.speedup:.2f}x ± {t.speedup_stdev:.2f}"


@dataclass
class Progress:
    """What the lines need to remember across events: the budget and the best trial so far."""

    budget_s: float | None = None
    best: TrialResult | None = None
    trials: dict[int, TrialResult] = field(default_factory=dict)

    def describe(self, event: RunEvent) -> str | None:
        """A one-line account of a session event, or None for one not worth a line."""
        p = event.payload
        if isinstance(p, TuneRequested):
            self.budget_s = p.request.budget_minutes * 60
            return f"queued: tuning run {p.request.run_id} for {clock(self.budget_s)}"
        if isinstance(p, TuneStarted):
            self.budget_s = p.budget_s
            names = ", ".join(d.name for d in p.space)
            return f"started: {len(p.space)} dimensions ({names}); {p.seeded} seeded from T1"
        if isinstance(p, TuneTrialCompleted):
            return self._trial(p)
        if isinstance(p, TuneImproved):
            return None  # the trial's own line shows the new best
        if isinstance(p, TuneSpaceNarrowed):
            dropped = ", ".join(f"{k}={v}" for k, v in p.dropped.items()) or "nothing"
            return f"space narrowed after {p.after_trials} trials: fixed {dropped}"
        if isinstance(p, TuneTerminated):
            return f"auto-terminated at {clock(p.elapsed_s)}: {p.reason}"
        if isinstance(p, TuneCompleted):
            winner = f"winner {p.winner.candidate.candidate_id}" if p.winner else "no winner"
            return f"completed ({p.reason}): {p.trials} trials, {p.failed_trials} failed; {winner}"
        if isinstance(p, TuneFailed):
            return f"failed at {p.error_stage}: {p.message}"
        return event.type

    def _trial(self, p: TuneTrialCompleted) -> str:
        t = p.result
        self.trials[t.trial] = t
        if (
            t.state == "complete"
            and t.value is not None
            and (self.best is None or self.best.value is None or t.value > self.best.value)
        ):
            self.best = t
        failed = f"FAILED ({t.error_stage}: {t.error_message})"
        outcome = failed if t.state == "failed" else trial_speed(t)
        best = "no best yet"
        if self.best is not None:
            best = f"best {trial_speed(self.best, sigma=False)} (trial {self.best.trial})"
        budget = f" of {clock(self.budget_s)}" if self.budget_s else ""
        seeded = " (seeded)" if t.seeded else ""
        return (
            f"trial {t.trial}{seeded}  {candidate_text(t.candidate)}  {outcome}  {best}  "
            f"[{clock(p.point.elapsed_s)}{budget}]"
        )


def session_summary(session: TuneSession) -> str:
    """The session's end: status, why, trials, the winner."""
    lines = [f"tune session {session.id}: {session.status}"]
    if session.status == "failed" and session.error is not None:
        lines.append(f"failed at {session.error.error_stage}: {session.error.message}")
        return "\n".join(lines)
    failed = sum(1 for t in session.trials if t.state == "failed")
    why = f"; {session.termination_reason}" if session.termination_reason else ""
    lines.append(f"{len(session.trials)} trials ({failed} failed){why}")
    if session.auto_terminated:
        lines.append("auto-terminated: the top 3 stopped improving by more than 1 sigma")
    if session.dropped:
        lines.append("dropped: " + ", ".join(f"{k}={v}" for k, v in session.dropped.items()))
    if session.winner is None:
        lines.append("no winner: no trial beat plain decoding")
    else:
        best = session.best
        speed = trial_speed(best) if best is not None else "-"
        lines.append(f"winner: {candidate_text(session.winner.candidate)}  {speed}")
    if session.curve_png:
        lines.append(f"curve: {session.curve_png}")
    return "\n".join(lines)
