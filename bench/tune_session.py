"""A T2 tune session on this machine, as a user runs one, against a running stack (`specops up`).

1. A fresh tenant (its token issued straight into the stack's database, as
   bench/t1_latency.py does), so no winner cache or datastore of another run interferes.
2. With --corpus-dir: the tenant uploads a corpus (every `*.py` file under the folders
   given, one JSONL record each) as its REST datastore (`POST datastores`).
3. A T1 run for smollm2-135m-instruct / --fingerprint / cpu / --engine (speccore, or
   vLLM's CPU build where `make setup` installed it), followed to its end.
4. A tune session on that run (`POST tune-sessions`, --budget-minutes, --families), its
   events printed as they come (one line per trial).
5. The result: the T1 winner (as T1 measured it, and as the session re-measured it among
   its seeded trials), the tuned winner with mean ± sigma, whether the tuned winner is at
   least T1's within sigma, every trial, the best-so-far curve (JSON, and the PNG the
   gateway draws, next to --out), and which trials measured REST on the uploaded corpus.

    .venv/bin/python bench/tune_session.py --fingerprint code --budget-minutes 20 \
        --out bench/results/tune-code-cpu2.json
    .venv/bin/python bench/tune_session.py --fingerprint code --budget-minutes 12 --families rest \
        --corpus-dir .venv/lib/python3.11/site-packages/pydantic --out bench/results/tune-corpus-cpu2.json
    .venv/bin/python bench/tune_session.py --engine vllm --fingerprint code --budget-minutes 30 \
        --out bench/results/tune-vllm-code-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import fresh_token, machine

from specops.client import SpeculativeClient, default_url
from specops_schemas.candidates import CandidateResult
from specops_schemas.tune import TrialResult, TuneSessionResponse, TuneTrialCompleted
from specplatform.settings import load_settings

MODEL = "smollm2-135m-instruct"
RUN_TIMEOUT_S = 1800.0
REGISTER_WAIT_S = 5.0


def corpus_jsonl(folders: list[Path]) -> bytes:
    """Every `*.py` file under `folders`, one `{"text": ...}` record each (sorted, so the
    same folders give the same bytes, hence the same datastore)."""
    lines = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text(errors="replace")
            if text.strip():
                lines.append(json.dumps({"text": text}))
    if not lines:
        raise SystemExit(f"tune_session: no *.py file under {', '.join(map(str, folders))}")
    return ("\n".join(lines) + "\n").encode()


def t1_run(client: SpeculativeClient, fingerprint: str, engine: str) -> Any:
    run = client.runs.create(
        target={"model_ref": MODEL, "gpu": "cpu", "engine": engine}, workload=fingerprint
    )
    print(f"T1 run {run.id} ({fingerprint}) ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    for event in client.runs.stream(run.id):
        print(f"  {event.type}", file=sys.stderr, flush=True)
        if time.monotonic() - start > RUN_TIMEOUT_S:
            raise SystemExit(f"tune_session: run {run.id} did not finish within {RUN_TIMEOUT_S:g} s")
    final = client.runs.get(run.id)
    if final.status != "completed" or not final.measured:
        raise SystemExit(f"tune_session: run {run.id} is {final.status} (measured={final.measured})")
    return final


def trial_line(result: TrialResult) -> str:
    c = result.candidate
    if result.state != "complete":
        head = f"trial {result.trial:>3}  {c.candidate_id:<44}"
        return f"{head} failed ({result.error_stage}): {result.error_message}"
    sigma = f" ± {result.speedup_stdev:.3f}" if result.speedup_stdev is not None else ""
    speed = f"{result.speedup or 0:.3f}x{sigma}"
    return f"trial {result.trial:>3}  {c.candidate_id:<44} {speed}  value {result.value:.3f}"


def follow(client: SpeculativeClient, session_id: str) -> None:
    for event in client.tune_sessions.stream(session_id):
        payload = event.payload
        if isinstance(payload, TuneTrialCompleted):
            best = payload.point.best_value
            print(
                f"{trial_line(payload.result)}  best {best if best is None else round(best, 3)}", flush=True
            )
        elif event.type != "tune.requested":
            print(f"  {event.type}", flush=True)


def comparison(t1: CandidateResult | None, session: TuneSessionResponse) -> dict[str, Any] | None:
    """The tuned winner against T1's: as T1 measured it (its mean per-rep speedup and sigma), and
    as this session re-measured T1's winner among its seeded trials (same session, same
    conditions). "Within sigma" uses the sigma of the difference, sqrt(sigma_t1^2 + sigma_tuned^2)."""
    best = session.best
    if best is None or best.speedup is None or t1 is None or t1.measurement is None:
        return None
    m = t1.measurement
    t1_speedup = m.speedup_mean if m.speedup_mean is not None else m.speedup
    sigma = math.hypot(m.speedup_stdev or 0.0, best.speedup_stdev or 0.0)
    verdict: dict[str, Any] = {
        "t1_winner": t1.candidate.candidate_id,
        "t1_winner_speedup_in_t1": t1_speedup,
        "t1_winner_sigma_in_t1": m.speedup_stdev,
        "t1_winner_reps_in_t1": m.reps,
        "tuned_winner": best.candidate.candidate_id,
        "tuned_winner_speedup": best.speedup,
        "tuned_winner_sigma": best.speedup_stdev,
        "sigma_of_difference": sigma,
        "at_least_t1_within_sigma": best.speedup >= t1_speedup - sigma,
    }
    again = [t for t in session.trials if t.seeded and _same_config(t.candidate, t1.candidate)]
    if again and again[0].state == "complete" and again[0].speedup is not None:
        verdict["t1_winner_remeasured_in_session"] = again[0].speedup
        verdict["t1_winner_remeasured_sigma"] = again[0].speedup_stdev
        verdict["tuned_minus_remeasured_t1"] = best.speedup - again[0].speedup
    return verdict


def summary(run: Any, session: TuneSessionResponse, datastore_id: str | None) -> dict[str, Any]:
    t1 = run.winner
    trials = session.trials
    rest_on_corpus = [
        t.model_dump(mode="json")
        for t in trials
        if datastore_id is not None and t.candidate.family == "rest" and t.candidate.draft == datastore_id
    ]
    return {
        "t1_run": {
            "id": run.id,
            "winner": t1.model_dump(mode="json") if t1 is not None else None,
            "candidates": len(run.candidates),
            "pareto_front": run.pareto_front,
        },
        "session": session.model_dump(mode="json"),
        "comparison": comparison(t1, session),
        "datastore_id": datastore_id,
        "rest_trials_on_corpus": rest_on_corpus,
        "trials": len(trials),
        "failed_trials": sum(t.state == "failed" for t in trials),
    }


def _same_config(a: Any, b: Any) -> bool:
    return (a.family, a.draft, a.k, a.tree, dict(a.options)) == (
        b.family,
        b.draft,
        b.k,
        b.tree,
        dict(b.options),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fingerprint", default="code")
    parser.add_argument("--engine", default="speccore", choices=("speccore", "vllm"))
    parser.add_argument("--budget-minutes", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=None, help="reps per trial (default: the tuner's)")
    parser.add_argument("--families", default=None, help="comma-separated families the search may try")
    parser.add_argument("--corpus-dir", type=Path, action="append", default=[], help="upload *.py under it")
    parser.add_argument("--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)")
    parser.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    parser.add_argument("--out", type=Path, default=Path("bench/results/tune-code-cpu2.json"))
    args = parser.parse_args()

    dsn = args.database_url or load_settings().require_database_url()
    before = machine()
    with SpeculativeClient(args.url, fresh_token(dsn, "tune-bench", name="bench/tune_session.py")) as client:
        datastore_id = None
        if args.corpus_dir:
            data = corpus_jsonl(args.corpus_dir)
            store = client.datastores.upload(
                data,
                name="+".join(p.name for p in args.corpus_dir),
                fingerprints=[args.fingerprint],
                jsonl=True,
            )
            datastore_id = store.id
            print(f"datastore {store.id}: {len(data):,} bytes", file=sys.stderr, flush=True)
            # The predictor learns the datastore from its event, a moment after the upload.
            time.sleep(REGISTER_WAIT_S)
        run = t1_run(client, args.fingerprint, args.engine)
        if datastore_id is not None and not any(c.candidate.draft == datastore_id for c in run.candidates):
            raise SystemExit(
                f"tune_session: T1 run {run.id} offers no candidate drafting from {datastore_id}"
            )
        families = args.families.split(",") if args.families else None
        session = client.tune_sessions.create(
            run.id, budget_minutes=args.budget_minutes, reps=args.reps, families=families
        )
        print(f"tune session {session.id}: budget {args.budget_minutes:g} min", file=sys.stderr, flush=True)
        follow(client, session.id)
        final = client.tune_sessions.get(session.id)
        png = client.tune_sessions.curve_png(session.id) if final.curve else None

    result = {
        "gateway": args.url or default_url(),
        "model": MODEL,
        "engine": args.engine,
        "fingerprint": args.fingerprint,
        "budget_minutes": args.budget_minutes,
        "families": args.families,
        "machine": before | {"load_average_after": os.getloadavg()},
        **summary(run, final, datastore_id),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if png is not None:
        args.out.with_suffix(".png").write_bytes(png)
    print(json.dumps(result["comparison"], indent=2))
    print(
        f"{final.status}: {len(final.trials)} trials, auto_terminated={final.auto_terminated}, "
        f"{final.termination_reason}; wrote {args.out}",
        file=sys.stderr,
    )
    return 0 if final.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
