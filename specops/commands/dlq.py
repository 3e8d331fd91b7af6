"""`specops dlq ls | show | redrive`: the messages services gave up on, read from the SPEC stream.

- `ls` lists the dead letters (`spec.dlq.<service>`): stream sequence, when parked,
  service, original subject, error, and whether (when) each was redriven.
- `show SEQ` prints one letter whole, its body decoded when it is JSON.
- `redrive SEQ` (or `--all`, of one `--service`) republishes the parked message on its
  original subject once the error that parked it is fixed (specops.runtime.dlq); a letter
  redriven before is refused unless `--force`.

Exit codes: 0 done; 2 bad input or nothing to talk to (one line on stderr).
Connections: NATS_URL and the admin credentials `specops up` wrote (specplatform.settings).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from specplatform.settings import load_settings

if TYPE_CHECKING:
    from specops.runtime.dlq import ParkedLetter

T = TypeVar("T")
ERROR_CHARS = 60
_PARKED = "%Y-%m-%dT%H:%M:%SZ"


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `dlq ls`, `dlq show` and `dlq redrive` to the `specops` subcommands (`sub`)."""
    dlq = sub.add_parser("dlq", help="list, show and redrive dead letters (messages a service gave up on)")
    dlq.set_defaults(handler=run)
    actions = dlq.add_subparsers(dest="dlq_action", required=True, parser_class=type(dlq))

    ls = actions.add_parser("ls", help="list the dead letters, oldest first")
    ls.add_argument("--service", help="only this service's letters (as in spec.dlq.<service>)")
    ls.add_argument("--json", action="store_true", help="one JSON object per letter")
    ls.set_defaults(dlq_run=_ls)

    show = actions.add_parser("show", help="print one dead letter whole")
    show.add_argument("seq", type=_seq, help="its stream sequence (see `specops dlq ls`)")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(dlq_run=_show)

    redrive = actions.add_parser(
        "redrive",
        help="republish a parked message on its original subject (after fixing what parked it)",
        description="Republish the parked message (body and headers, a fresh Nats-Msg-Id) on its "
        "original subject, where the consumers that gave up on it take it again, and record the "
        "redrive; `ls` shows it. A letter redriven before is refused unless --force.",
    )
    which = redrive.add_mutually_exclusive_group(required=True)
    which.add_argument("seq", type=_seq, nargs="?", help="the letter's stream sequence")
    which.add_argument("--all", action="store_true", help="every letter not redriven yet (of --service)")
    redrive.add_argument("--service", help="with --all: only this service's letters")
    redrive.add_argument("--force", action="store_true", help="redrive a letter redriven before, again")
    redrive.set_defaults(dlq_run=_redrive)


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a stream sequence: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"stream sequences start at 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    code: int = args.dlq_run(args)
    return code


def _connected(work: Callable[[Any], Awaitable[T]]) -> T:
    """`work(nc)` on a fail-fast NATS connection as the runtime's admin."""
    from specops.runtime.dlq import DlqError
    from specops_services.audit.replay import ReplayError, connect

    settings = load_settings()
    url = settings.require_nats_url()

    async def go() -> T:
        nc = await connect(url, settings.nats_credentials())
        try:
            return await work(nc)
        finally:
            await nc.close()

    try:
        return asyncio.run(go())
    except ReplayError as exc:
        raise DlqError(str(exc)) from None


def _ls(args: argparse.Namespace) -> int:
    from specops.runtime.dlq import letters

    found = _connected(lambda nc: letters(nc, args.service))
    if args.json:
        for parked in found:
            print(json.dumps(summary(parked)))
        return 0
    if not found:
        print("no dead letters" + (f" of {args.service}" if args.service else ""))
        return 0
    for line in table(found):
        print(line)
    return 0


def _show(args: argparse.Namespace) -> int:
    from specops.runtime.dlq import letter_at

    parked = _connected(lambda nc: letter_at(nc, args.seq))
    print(json.dumps(detail(parked), indent=None if args.json else 2))
    return 0


def _redrive(args: argparse.Namespace) -> int:
    from specops.runtime.dlq import DlqError, letters, redrive

    if args.all:

        async def every(nc: Any) -> list[str]:
            done = []
            for parked in await letters(nc, args.service):
                if parked.redriven is None or args.force:
                    record = await redrive(nc, parked.seq, force=args.force)
                    done.append(f"redrove {parked.seq} -> {record.subject} (seq {record.republished_seq})")
            return done

        lines = _connected(every)
        print("\n".join(lines) if lines else "nothing to redrive")
        return 0
    if args.service is not None:
        raise DlqError("--service goes with --all; a sequence names one letter already")
    record = _connected(lambda nc: redrive(nc, args.seq, force=args.force))
    print(f"redrove {args.seq} -> {record.subject} (seq {record.republished_seq})")
    return 0


# --- formatting (pure) --------------------------------------------------------------------------


def summary(parked: ParkedLetter) -> dict[str, Any]:
    """One letter as `ls --json` prints it."""
    letter = parked.letter
    return {
        "seq": parked.seq,
        "parked_at": parked.time.strftime(_PARKED),
        "service": letter.service,
        "subject": letter.subject,
        "deliveries": letter.deliveries,
        "error": letter.error,
        "redriven_at": None if parked.redriven is None else parked.redriven.redriven_at.strftime(_PARKED),
    }


def table(found: list[ParkedLetter]) -> list[str]:
    """`ls` as aligned columns, the error cut to ERROR_CHARS."""
    rows = [("SEQ", "PARKED", "SERVICE", "SUBJECT", "REDRIVEN", "ERROR")]
    for parked in found:
        row = summary(parked)
        error = " ".join(str(row["error"]).split())
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 1] + "…"
        rows.append(
            (
                str(row["seq"]),
                row["parked_at"],
                row["service"],
                row["subject"],
                row["redriven_at"] or "-",
                error,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]


def detail(parked: ParkedLetter) -> dict[str, Any]:
    """One letter whole, as `show` prints it: the body as JSON when it is JSON, else as text
    (JSON nested deeper than Python reads and writes) or base64 (not UTF-8)."""
    letter = parked.letter
    return summary(parked) | {
        "headers": letter.headers,
        "body": _body(bytes(letter.data)),
        "omitted_bytes": letter.omitted_bytes,
        "stream": letter.stream,
        "stream_sequence": letter.stream_sequence,
        "redrive": None if parked.redriven is None else parked.redriven.model_dump(mode="json"),
    }


def _body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        body = json.loads(raw)
        json.dumps(body)  # as deep as json.loads took, the printing must take it too
        return body
    except RecursionError:
        # Poison is parked as it came: nesting deep enough to overflow the reader is a reason
        # it was parked, and must not stop anyone from reading it.
        try:
            return {"text": raw.decode(), "note": "JSON nested too deep to show as a value"}
        except UnicodeDecodeError:
            pass
    except ValueError:
        pass
    return {"base64": base64.b64encode(raw).decode()}
