"""`specops audit verify | replay`: check the audit log's hash chain, re-read the event stream.

Exit codes: 0 done (chain intact); 1 the chain is broken (the output names the first
broken seq and why); 2 bad input or nothing to talk to (one line on stderr).
Connections come from `specplatform.settings` (DATABASE_URL, NATS_URL, or what
`specops up` wrote).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from specbus.subjects import PREFIX
from speccore.errors import SpecError
from specplatform.settings import load_settings

EXIT_BROKEN = 1

_AGE = re.compile(r"(\d+)([smhd])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_TOKEN = re.compile(r"[^\s.*>]+|\*")


class AuditCommandError(SpecError):
    """`specops audit` could not run; printed as one line."""


def parse_since(text: str) -> datetime:
    """ISO 8601 with a UTC offset (`2026-11-23T14:00:00Z`) or an age before now (`90s`, `15m`, `2h`, `7d`)."""
    age = _AGE.fullmatch(text.strip())
    if age:
        return datetime.now(UTC) - timedelta(**{_AGE_UNITS[age[2]]: int(age[1])})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r}; use ISO 8601 with an offset (2026-11-23T14:00:00Z) "
            "or an age (15m, 2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        # Stream times are UTC; guessing the zone of a bare time would shift the replay.
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add Z or +HH:MM")
    return moment


def _stream_seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"stream sequences start at 1, got {value}")
    return value


def _subject_filter(text: str) -> str:
    """A NATS subject (wildcards allowed) inside the stream's `spec.>`."""
    tokens = text.split(".")
    valid = all(_TOKEN.fullmatch(t) or (t == ">" and i == len(tokens) - 1) for i, t in enumerate(tokens))
    if not valid or tokens[0] != PREFIX or len(tokens) < 2:
        raise argparse.ArgumentTypeError(
            f"not a subject filter in the stream: {text!r}; e.g. 'spec.run.>' or 'spec.run.*.completed'"
        )
    return text


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `audit verify` and `audit replay` to the `specops` subcommands (`sub`)."""
    audit = sub.add_parser("audit", help="verify the audit log's hash chain; replay the event stream")
    audit.set_defaults(handler=run)
    actions = audit.add_subparsers(dest="audit_action", required=True, parser_class=type(audit))

    verify = actions.add_parser("verify", help="recompute the hash chain of the audit log")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(audit_run=_verify)

    replay = actions.add_parser(
        "replay", help="re-read the SPEC stream from a time or sequence up to its current end"
    )
    start = replay.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--since", type=parse_since, metavar="TIME", help="ISO 8601 with offset, or an age: 90s, 15m, 2h, 7d"
    )
    start.add_argument("--from-seq", type=_stream_seq, metavar="N", help="stream sequence to start at (>= 1)")
    replay.add_argument(
        "--subject", type=_subject_filter, help="only this subject (wildcards allowed), e.g. 'spec.run.>'"
    )
    replay.add_argument("--json", action="store_true", help="one JSON object per line")
    replay.set_defaults(audit_run=_replay)


def run(args: argparse.Namespace) -> int:
    """Run the parsed `specops audit ...` command; AuditCommandError (a SpecError) when it cannot."""
    try:
        code: int = args.audit_run(args)
    except BrokenPipeError:
        # `specops audit replay ... | head`: the reader left, which is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


def _verify(args: argparse.Namespace) -> int:
    from specops_services.audit import db

    dsn = load_settings().require_database_url()

    async def check() -> Any:
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            raise AuditCommandError(f"cannot connect to the database: {_first_line(exc)}") from None
        try:
            async with conn:
                return await db.verify(conn)
        except psycopg.errors.UndefinedTable:
            raise AuditCommandError(
                "the database has no audit log yet: run `specops up` to migrate it"
            ) from None
        except psycopg.Error as exc:
            raise AuditCommandError(f"cannot read the audit log: {_first_line(exc)}") from None

    report = asyncio.run(check())
    print(json.dumps(report.to_dict()) if args.json else report.summary())
    return 0 if report.ok else EXIT_BROKEN


def _replay(args: argparse.Namespace) -> int:
    from specops_services.audit.replay import ReplayError, ReplayStart, connect, replay

    url = load_settings().require_nats_url()
    start = ReplayStart(since=args.since, seq=args.from_seq)

    async def stream() -> None:
        nc = await connect(url)
        try:
            async for event in replay(nc, start, args.subject):
                print(json.dumps(event.to_dict()) if args.json else event.line())
        finally:
            await nc.close()
        sys.stdout.flush()

    try:
        asyncio.run(stream())
    except ReplayError as exc:
        raise AuditCommandError(str(exc)) from None
    return 0


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
