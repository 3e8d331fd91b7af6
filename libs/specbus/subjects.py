"""NATS subjects: ``spec.<aggregate>.<id>.<event>`` and the dead-letter ``spec.dlq.<service>``.

One JetStream stream (``SPEC``) captures ``spec.>``; services filter on patterns
such as ``spec.run.*.requested``.

Upstream systems (one NATS user per tenant) publish run requests on
``specops.intake.<tenant>.run.requested`` and read their runs' events back on
``specops.results.<tenant>.>``. Each has a stream of its own (``SPEC_INTAKE``,
``SPEC_RESULTS``), so nothing a tenant publishes lands in ``SPEC``: it cannot reach the
services' consumers, nor pre-empt an event through ``SPEC``'s dedup window.
"""

from __future__ import annotations

import re
from typing import NamedTuple

PREFIX = "spec"
STREAM = "SPEC"
STREAM_SUBJECTS = f"{PREFIX}.>"
DLQ = "dlq"
DLQ_SUBJECTS = f"{PREFIX}.{DLQ}.>"
# `specops dlq redrive` records each letter it redrove on `spec.redriven.<service>.<letter seq>`:
# outside `spec.dlq.>`, so the dead-letter consumers never take a record for a letter.
REDRIVEN = "redriven"
REDRIVEN_SUBJECTS = f"{PREFIX}.{REDRIVEN}.>"

INTAKE_STREAM = "SPEC_INTAKE"
INTAKE_PREFIX = "specops.intake"
RESULTS_STREAM = "SPEC_RESULTS"
RESULTS_PREFIX = "specops.results"
INTAKE_REQUEST = "run.requested"

AGGREGATES = ("run", "bench", "gate", "tune", "head", "registry", "security", "serve", "workload")

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


def redriven_subject(service: str, letter_seq: int) -> str:
    """Where the redrive of `service`'s dead letter at stream sequence `letter_seq` is recorded."""
    if letter_seq < 1:
        raise ValueError(f"stream sequences start at 1, got {letter_seq}")
    return f"{PREFIX}.{REDRIVEN}.{_check('service', service, _NAME)}.{letter_seq}"


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


def template(value: str) -> str:
    """What kind of message a subject carries, with its ids and tenant replaced by `*`:
    ``spec.run.<id>.requested`` -> ``spec.run.*.requested``, ``specops.intake.<tenant>.run.requested``
    -> ``specops.intake.*.run.requested``, ``specops.results.<tenant>.run.<id>.run.completed`` ->
    ``specops.results.*.run.*.run.completed``; a dead-letter subject (``spec.dlq.<service>``) is
    its own template. What a span is named after and a metric labelled with: never an id, so
    few distinct values. Anything else is ``other``: what a subject of no known shape holds is
    unknown.
    """
    tokens = value.split(".")
    if len(tokens) == 4 and tokens[0] == PREFIX and tokens[1] in AGGREGATES:
        return f"{PREFIX}.{tokens[1]}.*.{tokens[3]}" if _NAME.fullmatch(tokens[3]) else "other"
    if len(tokens) == 3 and tokens[:2] == [PREFIX, DLQ] and _NAME.fullmatch(tokens[2]):
        return value
    if value.startswith(f"{INTAKE_PREFIX}.") and value.endswith(f".{INTAKE_REQUEST}"):
        return intake_pattern()
    results = RESULTS_PREFIX.split(".")
    if tokens[:2] == results and len(tokens) == 7 and tokens[3] == "run" and tokens[5] in AGGREGATES:
        return f"{RESULTS_PREFIX}.*.run.*.{tokens[5]}.{tokens[6]}" if _NAME.fullmatch(tokens[6]) else "other"
    if tokens[:2] == results and len(tokens) == 5 and tokens[3] == "intake" and _NAME.fullmatch(tokens[4]):
        return f"{RESULTS_PREFIX}.*.intake.{tokens[4]}"
    return "other"


def intake_subject(tenant: str) -> str:
    """Where `tenant`'s upstream systems publish run requests."""
    return f"{INTAKE_PREFIX}.{_check('tenant', tenant, _ID)}.{INTAKE_REQUEST}"


def intake_pattern() -> str:
    """Every tenant's intake subject (the gateway's consumer filter)."""
    return f"{INTAKE_PREFIX}.*.{INTAKE_REQUEST}"


def intake_tenant(value: str) -> str:
    """The tenant an intake subject belongs to; ValueError if it is not one.

    The tenant is bound from the subject, never from the body: NATS lets a tenant's
    user publish only on its own intake subject.
    """
    prefix, _, rest = value.partition(f".{INTAKE_REQUEST}")
    head, _, tenant = prefix.rpartition(".")
    if rest or head != INTAKE_PREFIX:
        raise ValueError(f"{value!r} is not an intake subject ({INTAKE_PREFIX}.<tenant>.{INTAKE_REQUEST})")
    return _check("tenant", tenant, _ID)


def result_subject(tenant: str, run_id: str, event_type: str) -> str:
    """Where a run's event is repeated for its tenant, e.g. `specops.results.acme.run.<id>.run.completed`."""
    aggregate, _, event = event_type.partition(".")
    _check_aggregate(aggregate)
    where = f"{RESULTS_PREFIX}.{_check('tenant', tenant, _ID)}.run.{_check('id', run_id, _ID)}"
    return f"{where}.{aggregate}.{_check('event', event, _NAME)}"


def results_pattern(tenant: str = "*") -> str:
    """Everything `tenant` reads back (`*`: every tenant's, what the gateway publishes)."""
    if tenant != "*":
        _check("tenant", tenant, _ID)
    return f"{RESULTS_PREFIX}.{tenant}.>"


def tenant_inbox_prefix(tenant: str) -> str:
    """The reply subjects of a tenant's connections (`nats.connect(..., inbox_prefix=...)`):
    its NATS user may subscribe to these only, as a service to `specbus.broker.inbox_prefix`."""
    return f"_INBOX.tenant.{_check('tenant', tenant, _ID)}"


def intake_answer_subject(tenant: str, answer: str) -> str:
    """Where `tenant` hears that an intake request was `accepted` (and as which run) or `rejected`."""
    return f"{RESULTS_PREFIX}.{_check('tenant', tenant, _ID)}.intake.{_check('answer', answer, _NAME)}"


def stream_of(value: str) -> str:
    """The stream that stores a subject this system publishes."""
    if value.startswith(f"{RESULTS_PREFIX}."):
        return RESULTS_STREAM
    if value.startswith(f"{INTAKE_PREFIX}."):
        return INTAKE_STREAM
    return STREAM
