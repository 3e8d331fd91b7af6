"""NATS subjects: ``spec.<aggregate>.<id>.<event>`` and the dead-letter ``spec.dlq.<service>``.

One JetStream stream (``SPEC``) captures ``spec.>``; services filter on patterns
such as ``spec.run.*.requested``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

PREFIX = "spec"
STREAM = "SPEC"
STREAM_SUBJECTS = f"{PREFIX}.>"
DLQ = "dlq"
DLQ_SUBJECTS = f"{PREFIX}.{DLQ}.>"

AGGREGATES = ("run", "bench", "gate", "tune", "head", "registry", "security")

# Stricter than NATS itself (which only bans '.', '*', '>' and whitespace) so that a
# token can also be a path segment, a Postgres key and a CloudEvents value unescaped.
ID_PATTERN = r"[A-Za-z0-9_-]{1,128}"
_ID = re.compile(ID_PATTERN)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class Subject(NamedTuple):
    aggregate: str
    id: str
    event: str


def _check(kind: str, value: str, pattern: re.Pattern[str]) -> str:
    if not pattern.fullmatch(value):
        raise ValueError(f"invalid subject {kind} {value!r}: must match {pattern.pattern}")
    return value


def _check_aggregate(aggregate: str) -> str:
    if aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {aggregate!r}; valid aggregates: {', '.join(AGGREGATES)}")
    return aggregate


def subject(aggregate: str, id: str, event: str) -> str:
    """The concrete subject of one event, e.g. ``spec.run.<run id>.requested``."""
    _check_aggregate(aggregate)
    return f"{PREFIX}.{aggregate}.{_check('id', id, _ID)}.{_check('event', event, _NAME)}"


def pattern(aggregate: str, event: str = "*") -> str:
    """A consumer filter over every id, e.g. ``spec.gate.*.evaluated``."""
    _check_aggregate(aggregate)
    if event != "*":
        _check("event", event, _NAME)
    return f"{PREFIX}.{aggregate}.*.{event}"


def dlq_subject(service: str) -> str:
    """Where `service` parks messages it gave up on after its retries."""
    return f"{PREFIX}.{DLQ}.{_check('service', service, _NAME)}"


def parse(value: str) -> Subject:
    """Split an event subject into (aggregate, id, event); ValueError says what is wrong."""
    tokens = value.split(".")
    if len(tokens) >= 2 and tokens[:2] == [PREFIX, DLQ]:
        raise ValueError(f"{value!r} is a dead-letter subject, not an event subject")
    if len(tokens) != 4 or tokens[0] != PREFIX:
        raise ValueError(f"invalid subject {value!r}: expected '{PREFIX}.<aggregate>.<id>.<event>'")
    _, aggregate, id, event = tokens
    _check_aggregate(aggregate)
    return Subject(aggregate, _check("id", id, _ID), _check("event", event, _NAME))
