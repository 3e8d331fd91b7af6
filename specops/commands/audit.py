"""`specops audit verify | replay | diff`: check the audit log, re-read the stream, rebuild from it.

- `verify` recomputes the hash chain. That proves only that the log is self-consistent:
  whoever can write the table can rewrite a row, recompute every later hash with the
  database's own `audit_row_hash()` and move the chain head, and `verify` still passes.
  `verify --against-stream` also compares every row with the SPEC stream message at its
  `stream_seq` (the stream denies deletes and purges), which catches that rewrite.
- `replay` lists the stream's events from a time or sequence; `replay --rebuild --into
  DSN` re-drives them (from the start unless told) into a fresh database through the
  services' own projections (specops.runtime.rebuild).
- `diff --into DSN` compares that rebuilt database with the live one, row by row.

Exit codes: 0 done (chain intact, log matches the stream, no differences); 1 the chain
is broken, a row differs from the stream, or the databases differ (the output names
where and why); 2 bad input or nothing to talk to (one line on stderr).
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
from typing import TYPE_CHECKING, Any

from specbus.subjects import PREFIX
from speccore.errors import SpecError
from specplatform.settings import load_settings

if TYPE_CHECKING:
    import psycopg

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
    audit = sub.add_parser(
        "audit", help="verify the audit log (against the stream); replay the stream or rebuild from it"
    )
    audit.set_defaults(handler=run)
    actions = audit.add_subparsers(dest="audit_action", required=True, parser_class=type(audit))

    verify = actions.add_parser(
        "verify",
        help="recompute the hash chain of the audit log",
        description="Recompute the audit log's hash chain. Alone this proves only that the log is "
        "self-consistent: a row rewritten with every later hash recomputed (audit_row_hash()) and the "
        "chain head moved still passes. --against-stream also checks each row against the SPEC "
        "stream message at its stream_seq, which catches that.",
    )
    verify.add_argument(
        "--against-stream",
        action="store_true",
        help="also compare every row with the stream message it records (needs NATS)",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(audit_run=_verify)

    replay = actions.add_parser(
        "replay", help="re-read the SPEC stream from a time or sequence up to its current end"
    )
    start = replay.add_mutually_exclusive_group()
    start.add_argument(
        "--since", type=parse_since, metavar="TIME", help="ISO 8601 with offset, or an age: 90s, 15m, 2h, 7d"
    )
    start.add_argument("--from-seq", type=_stream_seq, metavar="N", help="stream sequence to start at (>= 1)")
    replay.add_argument(
        "--subject", type=_subject_filter, help="only this subject (wildcards allowed), e.g. 'spec.run.>'"
    )
    replay.add_argument("--json", action="store_true", help="one JSON object per line")
    replay.add_argument(
        "--rebuild",
        action="store_true",
        help="re-drive the events (from the start unless --since / --from-seq) into the fresh "
        "database --into through the services' projections, instead of listing them",
    )
    replay.add_argument("--into", metavar="DSN", help="the fresh database --rebuild writes (migrated first)")
    replay.set_defaults(audit_run=_replay)

    diff = actions.add_parser(
        "diff",
        help="compare a database rebuilt from the stream with the live one (DATABASE_URL)",
        description="Compare runs, run_events, candidates, bench_results, gate_results and "
        "winner_cache of the live database with those `replay --rebuild` wrote, row by row on the "
        "columns that carry meaning; print each difference (table, key, column, live vs rebuilt) "
        "and exit 1, or 'no differences' and exit 0. Compare while no run is in flight.",
    )
    diff.add_argument("--into", metavar="DSN", required=True, help="the database --rebuild wrote")
    diff.add_argument("--json", action="store_true", help="one JSON object per difference")
    diff.set_defaults(audit_run=_diff)


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
    import psycopg

    from specops_services.audit import db
    from specops_services.audit.against_stream import verify_against_stream
    from specops_services.audit.replay import ReplayError, connect

    settings = load_settings()
    dsn = settings.require_database_url()
    nats_url = settings.require_nats_url() if args.against_stream else None
    credentials = settings.nats_credentials()

    async def check() -> tuple[Any, Any]:
        conn = await _connect_db(dsn)
        try:
            async with conn:
                chain = await db.verify(conn)
                # Holes among the rows still let the stream name every missing message.
                if nats_url is None or chain.broken is not None:
                    return chain, None
                nc = await connect(nats_url, credentials)
                try:
                    return chain, await verify_against_stream(conn, nc)
                finally:
                    await nc.close()
        except psycopg.errors.UndefinedTable:
            raise AuditCommandError(
                "the database has no audit log yet: run `specops up` to migrate it"
            ) from None
        except psycopg.Error as exc:
            raise AuditCommandError(f"cannot read the audit log: {_first_line(exc)}") from None
        except ReplayError as exc:
            raise AuditCommandError(str(exc)) from None

    chain, stream = asyncio.run(check())
    if args.json:
        body = chain.to_dict() | ({} if stream is None else {"stream": stream.to_dict()})
        print(json.dumps(body))
    else:
        print(chain.summary())
        if stream is not None:
            print(stream.summary())
    return 0 if chain.ok and (stream is None or stream.ok) else EXIT_BROKEN


async def _connect_db(dsn: str) -> psycopg.AsyncConnection[Any]:
    import psycopg

    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise AuditCommandError(f"cannot connect to the database: {_first_line(exc)}") from None


def _replay(args: argparse.Namespace) -> int:
    from specops_services.audit.replay import ReplayError, ReplayStart, connect, replay

    if args.rebuild:
        return _rebuild(args)
    if args.into is not None:
        raise AuditCommandError("--into is the database of --rebuild; add --rebuild")
    if args.since is None and args.from_seq is None:
        raise AuditCommandError("say where to start: --since TIME or --from-seq N")
    settings = load_settings()
    url = settings.require_nats_url()
    start = ReplayStart(since=args.since, seq=args.from_seq)

    async def stream() -> None:
        nc = await connect(url, settings.nats_credentials())
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


def _rebuild(args: argparse.Namespace) -> int:
    import psycopg

    from specops.runtime.rebuild import RebuildError, RebuildReport, rebuild
    from specops_services.audit.replay import ReplayError, ReplayStart, connect
    from specplatform.db import MigrationError

    if args.into is None:
        raise AuditCommandError("--rebuild needs --into DSN, a fresh database to write")
    if args.subject is not None:
        raise AuditCommandError("--rebuild re-drives every event; --subject would leave runs half-built")
    settings = load_settings()
    url = settings.require_nats_url()
    start = ReplayStart(since=args.since, seq=args.from_seq or (None if args.since else 1))

    def progress(report: RebuildReport) -> None:
        print(f"... {report.events} events projected (stream seq {report.last_seq})", file=sys.stderr)

    async def drive() -> RebuildReport:
        nc = await connect(url, settings.nats_credentials())
        try:
            return await rebuild(nc, args.into, start, progress=progress)
        finally:
            await nc.close()

    try:
        report = asyncio.run(drive())
    except (ReplayError, RebuildError, MigrationError) as exc:
        raise AuditCommandError(str(exc)) from None
    except psycopg.OperationalError as exc:
        raise AuditCommandError(f"cannot connect to the database --into: {_first_line(exc)}") from None
    for unwritten in report.unwritten:
        print(f"not written: stream seq {unwritten.stream_seq} {unwritten.type}: {unwritten.error}")
    print(report.summary())
    return 0


def _diff(args: argparse.Namespace) -> int:
    import psycopg

    from specops.runtime.rebuild import diff

    live = load_settings().require_database_url()
    try:
        found = asyncio.run(diff(live, args.into))
    except psycopg.OperationalError as exc:
        raise AuditCommandError(f"cannot connect to a database: {_first_line(exc)}") from None
    except psycopg.Error as exc:
        raise AuditCommandError(f"cannot read the tables: {_first_line(exc)}") from None
    for difference in found:
        print(json.dumps(difference.to_dict()) if args.json else difference.line())
    if not found and not args.json:
        print("no differences")
    return EXIT_BROKEN if found else 0


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
