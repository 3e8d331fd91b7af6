"""What the commands that follow a gateway resource (`specops run`, `specops tune`) share:
one SDK client for the call, its errors as one line on stderr (exit 2), progress lines
on stderr unless the command prints JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from pydantic import ValidationError

from specops.client import SpecopsAPIError, SpecopsConnectionError, SpecopsError, SpeculativeClient

EXIT_ERROR = 2

Say = Callable[[str], None]


def call(
    command: str,
    args: argparse.Namespace,
    follow: Callable[[SpeculativeClient, argparse.Namespace], int],
    *,
    unauthorized_hint: str = "",
) -> int:
    """`follow(client, args)`'s exit code, or EXIT_ERROR with one line saying why it could not finish.

    `unauthorized_hint` is appended to a 401's message.
    """
    try:
        with SpeculativeClient(args.url, args.token) as client:
            return follow(client, args)
    except SpecopsConnectionError as exc:
        return error(command, f"no gateway at {exc.url}: run `specops up` (or pass --url)")
    except SpecopsAPIError as exc:
        hint = unauthorized_hint if exc.status == 401 else ""
        return error(command, f"{exc}{hint}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return error(command, f"invalid request: {where}: {first['msg']}")
    except SpecopsError as exc:
        return error(command, str(exc))


def error(command: str, message: str) -> int:
    print(f"specops {command}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def progress(json_output: bool) -> Say:
    """Where progress lines go: stderr, or nowhere when stdout carries only JSON."""
    return _quiet if json_output else stderr


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    return None
