"""The audit log's hash chain, and how a bus message becomes an audit entry (pure, no I/O).

Every row commits to the row before it: ``hash = sha256(domain tag, prev_hash, seq,
event_id, subject, type, tenant_id, stream_seq, recorded_at, payload)``, each field
length-prefixed so no two different rows concatenate to the same bytes. The first row
links to ``GENESIS_HASH``. Changing any column of any row, deleting a row or reordering
rows breaks the chain at that row or the one after it; deleting rows at the end is
caught by comparing the last row with the chain head (``ChainHead``).

The database computes the same hash when it appends (``audit_row_hash`` in
schemas/sql/004_audit.sql); this module recomputes it to verify, so the two must agree
byte for byte.

Glossary: an *entry* is what the service is about to append (no seq or hash yet); a
*row* is what the table holds; the *head* is the (seq, hash) of the last appended row.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from specbus.subjects import DLQ, PREFIX, REDRIVEN
from specbus.wire import loads_json
from specops_schemas.events import parse_event

GENESIS_HASH = bytes(32)
_DOMAIN = b"specops-audit-row-v1"
# Namespace of the ids given to messages that carry no event_id of their own
# (dead letters, malformed events): uuid5(namespace, subject + sha256(body)).
_RAW_NAMESPACE = uuid.UUID("6f1c2a52-2d0e-4d53-9b8e-3c1f0a7d4e21")

DLQ_TYPE = "dlq"
REDRIVEN_TYPE = "dlq.redriven"
INVALID_TYPE = "invalid"
_DLQ_PREFIX = f"{PREFIX}.{DLQ}."
_REDRIVEN_PREFIX = f"{PREFIX}.{REDRIVEN}."


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One message to append: its own event_id, or a content-derived one for non-events."""

    event_id: str
    subject: str
    type: str
    tenant_id: str | None
    payload: bytes  # canonical JSON of an event; a dead letter's body; the record of an invalid one
    stream_seq: int | None = None  # its sequence in the SPEC stream, when it came from there


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One row of ``audit_log`` as stored."""

    seq: int
    event_id: str
    subject: str
    type: str
    tenant_id: str | None
    payload: bytes
    stream_seq: int | None
    recorded_at: datetime
    prev_hash: bytes
    hash: bytes


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The last appended row as the appender recorded it (``GENESIS_HASH`` and 0 when empty)."""

    seq: int
    hash: bytes


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first row at which the chain does not hold, and why."""

    seq: int
    reason: str


Gap = tuple[int, int]  # an inclusive range of stream sequences that have no row


def seq_gaps(seqs: Iterable[int], *, first: int | None = None, last: int | None = None) -> list[Gap]:
    """The ranges of `first`..`last` (by default the smallest and largest of `seqs`) that
    `seqs` leaves out, in order; sequences outside the range are ignored."""
    ordered = sorted(set(seqs))
    low = first if first is not None else (ordered[0] if ordered else 1)
    high = last if last is not None else (ordered[-1] if ordered else 0)
    gaps: list[Gap] = []
    expected = low
    for seq in ordered:
        if seq < low:
            continue
        if seq > high:
            break
        if seq > expected:
            gaps.append((expected, seq - 1))
        expected = seq + 1
    if expected <= high:
        gaps.append((expected, high))
    return gaps


def describe_gaps(gaps: Iterable[Gap]) -> str:
    """`5..7, 9`: each missing range, a single sequence as itself."""
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in gaps)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    rows: int  # rows checked (up to and including the broken one)
    first_seq: int | None
    last_seq: int | None
    head_hash: bytes  # hash of the last row found intact
    broken: ChainBreak | None
    # Stream sequences missing between the rows' smallest and largest: each message of the
    # stream gets a row, so a hole is a row deleted (and the chain recomputed over it).
    gaps: tuple[Gap, ...] = ()

    @property
    def ok(self) -> bool:
        return self.broken is None and not self.gaps

    def summary(self) -> str:
        if self.broken is not None:
            return f"audit chain broken at seq {self.broken.seq}: {self.broken.reason}"
        if self.gaps:
            return (
                f"audit chain links but stream sequences {describe_gaps(self.gaps)} have no row "
                f"among the {self.rows} rows: rows deleted (or not recorded yet)"
            )
        if self.rows == 0:
            return "audit chain intact: empty"
        return (
            f"audit chain intact: {self.rows} rows, seq {self.first_seq}..{self.last_seq}, "
            f"head {self.head_hash.hex()[:16]}"
        )

    def to_dict(self) -> dict[str, Any]:
        broken = None if self.broken is None else {"seq": self.broken.seq, "reason": self.broken.reason}
        return {
            "ok": self.ok,
            "rows": self.rows,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "head_hash": self.head_hash.hex(),
            "broken": broken,
            "gaps": [list(gap) for gap in self.gaps],
        }


def _field(value: str | bytes | None) -> bytes:
    # A presence byte keeps None apart from the empty string.
    if value is None:
        return b"\x00"
    raw = value.encode() if isinstance(value, str) else value
    return b"\x01" + struct.pack(">Q", len(raw)) + raw


def timestamp_text(moment: datetime) -> str:
    """The form of recorded_at that is hashed: UTC, microseconds (PostgreSQL's precision)."""
    if moment.tzinfo is None:
        raise ValueError("recorded_at must be timezone-aware")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def row_hash(
    prev_hash: bytes,
    canonical: bytes,
    subject: str,
    *,
    seq: int,
    event_id: str,
    type: str,
    tenant_id: str | None,
    stream_seq: int | None,
    recorded_at: datetime,
) -> bytes:
    """sha256 of one row, committing to the previous row's hash (field order is the format)."""
    fields = (
        prev_hash,
        str(seq),
        event_id,
        subject,
        type,
        tenant_id,
        None if stream_seq is None else str(stream_seq),
        timestamp_text(recorded_at),
        canonical,
    )
    digest = hashlib.sha256(_DOMAIN)
    for value in fields:
        digest.update(_field(value))
    return digest.digest()


def hash_of(row: AuditRow) -> bytes:
    """The hash `row` should carry given its own contents and its prev_hash."""
    return row_hash(
        row.prev_hash,
        row.payload,
        row.subject,
        seq=row.seq,
        event_id=row.event_id,
        type=row.type,
        tenant_id=row.tenant_id,
        stream_seq=row.stream_seq,
        recorded_at=row.recorded_at,
    )


class ChainVerifier:
    """Checks rows one at a time in seq order, so a table of any size streams through it."""

    def __init__(self) -> None:
        self._rows = 0
        self._first: int | None = None
        self._last: AuditRow | None = None
        self._broken: ChainBreak | None = None
        self._stream_seqs: list[int] = []

    def feed(self, row: AuditRow) -> bool:
        """Check the next row; False once the chain is broken (later rows are not checked)."""
        if self._broken is not None:
            return False
        self._rows += 1
        self._broken = self._check(row)
        if self._broken is not None:
            return False
        if self._first is None:
            self._first = row.seq
        self._last = row
        if row.stream_seq is not None:
            self._stream_seqs.append(row.stream_seq)
        return True

    def _check(self, row: AuditRow) -> ChainBreak | None:
        last = self._last
        if last is not None and row.seq <= last.seq:
            return ChainBreak(row.seq, f"out of order: seq {row.seq} comes after seq {last.seq}")
        expected = GENESIS_HASH if last is None else last.hash
        if row.prev_hash != expected:
            if last is None:
                why = "the first row does not link to the genesis hash: earlier rows were deleted"
            else:
                why = (
                    f"prev_hash does not match the hash of seq {last.seq}: a row between them "
                    "was deleted or inserted, or rows were reordered"
                )
            return ChainBreak(row.seq, why)
        if hash_of(row) != row.hash:
            return ChainBreak(
                row.seq, "stored hash does not match the row's contents: the row (payload, "
                "metadata or hash) was altered",
            )  # fmt: skip
        return None

    def report(self, head: ChainHead | None = None, *, head_missing: bool = False) -> VerifyReport:
        """The verdict; with `head`, rows missing after the last one found are caught too.

        `head_missing` says the table that should hold the head is empty, itself a sign
        of tampering (the appender never deletes it).
        """
        broken = self._broken
        last_seq = None if self._last is None else self._last.seq
        last_hash = GENESIS_HASH if self._last is None else self._last.hash
        if broken is None and head_missing:
            broken = ChainBreak(last_seq or 0, "the chain head is missing: audit_chain_head was emptied")
        elif broken is None and head is not None and (head.seq, head.hash) != (last_seq or 0, last_hash):
            found = "no rows" if last_seq is None else f"the last row is seq {last_seq}"
            broken = ChainBreak(
                head.seq, f"the chain head records seq {head.seq} but {found}: rows were deleted at the end"
            )
        # Only over a chain read to its end: a broken one stopped early and would show false holes.
        gaps = tuple(seq_gaps(self._stream_seqs)) if broken is None else ()
        return VerifyReport(self._rows, self._first, last_seq, last_hash, broken, gaps)


def verify_chain(rows: Iterable[AuditRow], head: ChainHead | None = None) -> VerifyReport:
    """Verify rows given in seq order; the report names the first broken seq and why."""
    verifier = ChainVerifier()
    for row in rows:
        if not verifier.feed(row):
            break
    return verifier.report(head)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace: the same bytes `Envelope.to_json_bytes` produces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def raw_event_id(subject: str, data: bytes) -> str:
    """A stable id for a message without its own: a redelivery gets the same one."""
    return str(uuid.uuid5(_RAW_NAMESPACE, f"{subject}\n{hashlib.sha256(data).hexdigest()}"))


def is_dead_letter(subject: str) -> bool:
    return subject.startswith(_DLQ_PREFIX)


def entry_from_message(subject: str, data: bytes, stream_seq: int | None = None) -> AuditEntry:
    """What to record for a message on `subject`; never raises, because the audit keeps everything.

    - an event that validates: its own event_id, type and tenant, canonical JSON;
    - a dead letter (``spec.dlq.<service>``): type ``dlq``, the body verbatim, the tenant
      of the parked event when it can be read;
    - the record of a redriven letter (``spec.redriven.<service>.<seq>``): type
      ``dlq.redriven``, the body verbatim;
    - anything else on ``spec.>`` (malformed or unknown type): type ``invalid``, a JSON
      object with the validation error and the base64 body, so the audit shows it.
    """
    if is_dead_letter(subject):
        tenant = _dead_letter_tenant(data)
        return AuditEntry(raw_event_id(subject, data), subject, DLQ_TYPE, tenant, data, stream_seq)
    if subject.startswith(_REDRIVEN_PREFIX):
        # `specops dlq redrive`'s record that a letter was redriven: the operator's act, kept verbatim.
        return AuditEntry(raw_event_id(subject, data), subject, REDRIVEN_TYPE, None, data, stream_seq)
    try:
        event = parse_event(data)
    except ValueError as exc:
        record = {"error": str(exc), "data": base64.b64encode(data).decode()}
        payload = canonical_json(record)
        return AuditEntry(
            raw_event_id(subject, data), subject, INVALID_TYPE, _tenant_of(data), payload, stream_seq
        )
    return AuditEntry(event.event_id, subject, event.type, event.tenant_id, event.to_json_bytes(), stream_seq)


@dataclass(frozen=True, slots=True)
class StreamReport:
    """`verify --against-stream`: whether every row records the stream message at its
    stream_seq, and every message the stream holds has a row."""

    rows: int  # rows checked (up to and including the first that differs)
    broken: ChainBreak | None  # the first row that differs from its message
    retired: int = 0  # rows not checked: their messages are past the stream's age or size limit
    gaps: tuple[Gap, ...] = ()  # the stream's messages without a row: at its start, middle or end

    @property
    def ok(self) -> bool:
        return self.broken is None and not self.gaps

    def summary(self) -> str:
        if self.broken is not None:
            return f"audit log differs from the stream at seq {self.broken.seq}: {self.broken.reason}"
        if self.gaps:
            return (
                f"audit log misses stream messages {describe_gaps(self.gaps)}: no row records them "
                f"(rows deleted, or not recorded yet); {self.rows} rows match"
            )
        older = f" ({self.retired} older rows not checked: the stream no longer keeps them)"
        return f"audit log matches the stream: {self.rows} rows" + (older if self.retired else "")

    def to_dict(self) -> dict[str, Any]:
        broken = None if self.broken is None else {"seq": self.broken.seq, "reason": self.broken.reason}
        return {
            "ok": self.ok,
            "rows": self.rows,
            "retired": self.retired,
            "broken": broken,
            "gaps": [list(gap) for gap in self.gaps],
        }


def stream_mismatch(row: AuditRow, message: tuple[str, bytes] | None) -> str | None:
    """Why `row` is not what the audit records for `message` (subject, data), the stream's
    message at the row's stream_seq; None when it is."""
    if row.stream_seq is None:
        return "the row has no stream_seq, so no message of the stream vouches for it"
    if message is None:
        return f"the stream holds no message {row.stream_seq}"
    entry = entry_from_message(message[0], message[1], row.stream_seq)
    fields = (
        ("subject", row.subject, entry.subject),
        ("event_id", row.event_id, entry.event_id),
        ("type", row.type, entry.type),
        ("tenant_id", row.tenant_id, entry.tenant_id),
        ("payload", row.payload, entry.payload),
    )
    differs = [name for name, stored, recorded in fields if stored != recorded]
    if not differs:
        return None
    verb = "differs" if len(differs) == 1 else "differ"
    return f"stream_seq {row.stream_seq}: {', '.join(differs)} {verb} from the stream's message"


class StreamChecker:
    """Rows against their stream messages, one at a time; then which of the stream's messages,
    `first_kept_seq`..`last_seq`, have no row: the newest deleted with the chain head moved
    back, the oldest, or any between, each range named.

    The stream discards its oldest messages at its age or size limit (specbus.broker), so
    rows of messages before `first_kept_seq` have nothing left to be checked against and are
    only counted.
    """

    def __init__(self, first_kept_seq: int = 1, last_seq: int = 0) -> None:
        self.first_kept_seq = first_kept_seq
        self.last_seq = last_seq
        self._rows = 0
        self._retired = 0
        self._seqs: list[int] = []
        self._broken: ChainBreak | None = None

    def feed(self, row: AuditRow, message: tuple[str, bytes] | None) -> bool:
        """Check the next row; False once one differs (later rows are not checked)."""
        if self._broken is not None:
            return False
        if row.stream_seq is not None and row.stream_seq < self.first_kept_seq:
            self._retired += 1
            return True
        self._rows += 1
        reason = stream_mismatch(row, message)
        if reason is not None:
            self._broken = ChainBreak(row.seq, reason)
            return False
        if row.stream_seq is not None:
            self._seqs.append(row.stream_seq)
        return True

    def report(self) -> StreamReport:
        gaps: tuple[Gap, ...] = ()
        if self._broken is None:
            gaps = tuple(seq_gaps(self._seqs, first=self.first_kept_seq, last=self.last_seq))
        return StreamReport(self._rows, self._broken, retired=self._retired, gaps=gaps)


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = loads_json(data)
    except ValueError:  # UnicodeDecodeError is one too
        return None
    return value if isinstance(value, dict) else None


def _tenant_of(data: bytes) -> str | None:
    body = _json_object(data)
    tenant = None if body is None else body.get("tenant_id")
    return tenant if isinstance(tenant, str) and tenant else None


def _dead_letter_tenant(data: bytes) -> str | None:
    letter = _json_object(data)
    inner = None if letter is None else letter.get("data")
    if not isinstance(inner, str):
        return None
    try:
        return _tenant_of(base64.b64decode(inner, validate=True))
    except binascii.Error:
        return None
