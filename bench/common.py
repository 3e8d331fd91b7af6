"""What the bench scripts that drive a running stack share: a fresh tenant's token, the
facts about the machine a result was measured on, and engine-server measurements as rows."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import uuid
from typing import Any

from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token


def fresh_token(
    dsn: str, prefix: str, *, name: str, role: Role = Role.DEVELOPER, tenant: str | None = None
) -> str:
    """A token of a new tenant (`<prefix>-<random>`), or of `tenant`, issued straight into the
    stack's database: no winner cache, datastore or head of another run interferes."""
    tenant_id = tenant or f"{prefix}-{uuid.uuid4().hex[:12]}"
    return asyncio.run(issue_token(dsn, tenant_id=tenant_id, role=role, name=name)).secret


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def http_rows(outcome: Any) -> dict[str, Any]:
    """A benchmark-runner ``measure_http`` outcome as result rows: none (the engine's own
    plain decoding) and each candidate, by id, then the failures."""
    rows: dict[str, Any] = {}
    for m in [outcome.baseline, *outcome.results]:
        name = "none" if m.candidate_id == "baseline" else m.candidate_id
        rows[name] = {
            "tokens_per_s": m.tokens_per_s,
            "speedup": m.speedup,
            "mean_acceptance_length": m.mean_acceptance_length,
            "acceptance_rate": m.acceptance_rate,
            # The share of the gate's prompts token-identical to none: greedy runs only.
            "greedy_agreement": m.greedy_agreement,
            "identical_to_none": None if m.greedy_agreement is None else m.greedy_agreement == 1.0,
            "launch_args": m.launch_args,
        }
    if outcome.failures:
        rows["failures"] = {f.candidate_id: f.message for f in outcome.failures}
    return rows


def rows_line(rows: dict[str, Any]) -> str:
    """One line of result rows: each method's tokens/s, speedup and (where known) tokens a step."""

    def part(method: str, row: dict[str, Any]) -> str:
        mal = row.get("mean_acceptance_length")
        return f"{method} {row['tokens_per_s']:.1f} tok/s {row['speedup']:.2f}x" + (
            f" MAL {mal:.2f}" if isinstance(mal, int | float) else ""
        )

    return ", ".join(part(m, r) for m, r in rows.items() if isinstance(r, dict) and "tokens_per_s" in r)


def vllm_or_exit(parser: argparse.ArgumentParser) -> Any:
    """The installed vLLM engine environment's state; the parser exits saying how to install it
    when it cannot run."""
    from specplatform import engines

    state = engines.state("vllm")
    if not state.runnable:
        parser.error(f"{state.reason}; run `{state.install_command}` first")
    return state


def command_of(script: str, args: argparse.Namespace) -> str:
    """The command line that reproduces a run of `script` with `args` (--out left out)."""
    given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out")
    return f"python {script} {given}"
