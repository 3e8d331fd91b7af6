"""`specops fingerprint`: which workload fingerprint an endpoint serves, offline.

``--samples FILE`` reads a JSON Lines file of sample requests (speccatalog.fingerprint.samples)
and prints the inferred fingerprint, its confidence and the runner-up; ``--wizard`` asks the
console's three questions on the terminal instead (``--answers output,input,length`` answers
them without asking). With ``--json``, one JSON object on stdout.

Exit codes: 0 a fingerprint was printed; 2 the input was unusable (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from speccatalog.fingerprint import QUESTIONS, SampleError, UnknownAnswer, infer, read_samples, wizard
from specops.commands.client_command import error


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "fingerprint",
        help="infer a workload fingerprint from sample requests, or pick it with three questions",
        description="Infer the workload fingerprint of sample requests (a JSONL file of "
        '{"prompt": ...} or {"messages": [...]} lines), offline; or answer the three-question wizard.',
    )
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--samples", type=Path, help="JSON Lines file of sample requests ('-': stdin)")
    how.add_argument("--wizard", action="store_true", help="ask the three questions on the terminal")
    how.add_argument(
        "--answers",
        metavar="OUTPUT,INPUT,LENGTH",
        help="the wizard's three answers, comma separated: "
        + "; ".join(f"{q.name}: {'|'.join(v for v, _ in q.choices)}" for q in QUESTIONS),
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=fingerprint)


def fingerprint(args: argparse.Namespace, ask: Callable[[str], str] = input) -> int:
    """The `specops fingerprint` handler: the exit code."""
    try:
        if args.samples is not None:
            result = _from_samples(args.samples)
        else:
            answers = args.answers.split(",") if args.answers else [_ask(q, ask) for q in QUESTIONS]
            if len(answers) != len(QUESTIONS):
                raise UnknownAnswer(f"--answers takes {len(QUESTIONS)} answers, got {len(answers)}")
            names = (q.name for q in QUESTIONS)
            result = {"fingerprint": wizard(*answers), "answers": dict(zip(names, answers, strict=True))}
    except (OSError, SampleError, UnknownAnswer) as exc:
        return error("fingerprint", str(exc))
    except EOFError:
        return error("fingerprint", "the wizard needs answers on stdin (or pass --answers)")
    print(json.dumps(result) if args.json else _text(result))
    return 0


def _from_samples(path: Path) -> dict[str, Any]:
    if str(path) == "-":
        texts = read_samples(sys.stdin, "stdin")
    else:
        with path.open(encoding="utf-8") as fp:
            texts = read_samples(fp, str(path))
    inference = infer(texts)
    if inference is None:  # read_samples refuses an empty file first
        raise SampleError(f"{path} holds no sample")
    return asdict(inference)


def _ask(question: Any, ask: Callable[[str], str]) -> str:
    values = [value for value, _ in question.choices]
    menu = "\n".join(f"  {i}) {label} [{value}]" for i, (value, label) in enumerate(question.choices, 1))
    while True:
        reply = ask(f"{question.text}\n{menu}\n> ").strip()
        if reply in values:
            return reply
        if reply.isdigit() and 1 <= int(reply) <= len(values):
            return values[int(reply) - 1]
        print(f"answer 1-{len(values)} or one of: {', '.join(values)}", file=sys.stderr)


def _text(result: dict[str, Any]) -> str:
    if "confidence" not in result:
        return f"fingerprint: {result['fingerprint']}"
    return (
        f"fingerprint: {result['fingerprint']} (confidence {result['confidence']:.2f}, "
        f"{result['samples']} samples)\n"
        f"runner-up:   {result['runner_up']} ({result['runner_up_confidence']:.2f})"
    )
