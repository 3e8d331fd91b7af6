"""The audit hash chain and message classification, without a database."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specbus.dlq import DeadLetter
from specbus.envelope import new_event
from specops_schemas.events import RunQueued
from specops_services.audit.logic import (
    GENESIS_HASH,
    AuditRow,
    ChainHead,
    StreamChecker,
    entry_from_message,
    hash_of,
    raw_event_id,
    row_hash,
    seq_gaps,
    verify_chain,
)

T0 = datetime(2026, 11, 23, 14, 0, tzinfo=UTC)


def _chain(n: int, *, stride: int = 1) -> list[AuditRow]:
    rows: list[AuditRow] = []
    prev = GENESIS_HASH
    for seq in range(1, n + 1):
        event = new_event(
            RunQueued(run_id=f"r{seq}"), tenant_id="acme", correlation_id=f"r{seq}", producer="t"
        )
        entry = entry_from_message(event.subject, event.to_json_bytes(), stream_seq=seq * stride)
        row = AuditRow(
            seq, entry.event_id, entry.subject, entry.type, entry.tenant_id, entry.payload,
            entry.stream_seq, T0 + timedelta(seconds=seq), prev, b"",
        )  # fmt: skip
        row = replace(row, hash=hash_of(row))
        rows.append(row)
        prev = row.hash
    return rows


def _head(rows: list[AuditRow]) -> ChainHead:
    return ChainHead(rows[-1].seq, rows[-1].hash)


def test_an_intact_chain_verifies() -> None:
    rows = _chain(5)
    report = verify_chain(rows, _head(rows))
    assert report.ok and report.rows == 5 and (report.first_seq, report.last_seq) == (1, 5)
    assert report.summary().startswith("audit chain intact: 5 rows, seq 1..5")
    assert verify_chain([], ChainHead(0, GENESIS_HASH)).summary() == "audit chain intact: empty"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("payload", b"{}"),
        ("subject", "spec.run.x.queued"),
        ("tenant_id", None),
        ("type", "run.failed"),
        ("recorded_at", T0),
        ("stream_seq", None),
        ("hash", bytes(32)),
    ],
)
def test_an_altered_column_breaks_the_chain_at_that_row(field: str, value: object) -> None:
    rows = _chain(5)
    rows[2] = replace(rows[2], **{field: value})
    report = verify_chain(rows, _head(rows))
    assert report.broken is not None and report.broken.seq == 3 and "altered" in report.broken.reason
    assert report.rows == 3 and report.head_hash == rows[1].hash


def test_deleted_and_reordered_rows_break_the_link_after_them() -> None:
    rows = _chain(5)
    deleted = verify_chain(rows[:2] + rows[3:], _head(rows)).broken
    assert deleted is not None and deleted.seq == 4 and "deleted" in deleted.reason
    swapped = [rows[0], replace(rows[2], seq=2), replace(rows[1], seq=3), *rows[3:]]
    reordered = verify_chain(swapped, _head(rows)).broken
    assert reordered is not None and reordered.seq == 2 and "reordered" in reordered.reason
    first_gone = verify_chain(rows[1:], _head(rows)).broken
    assert first_gone is not None and first_gone.seq == 2 and "genesis" in first_gone.reason


def test_rows_deleted_at_the_end_are_caught_by_the_head() -> None:
    rows = _chain(5)
    assert verify_chain(rows[:4]).ok  # without the head nothing shows it
    tail = verify_chain(rows[:4], _head(rows)).broken
    assert tail is not None and tail.seq == 5 and "deleted at the end" in tail.reason
    emptied = verify_chain([], _head(rows)).broken
    assert emptied is not None and emptied.seq == 5


def test_the_hash_separates_fields_and_none_from_empty() -> None:
    common = {"seq": 1, "event_id": "e", "type": "t", "stream_seq": None, "recorded_at": T0}
    assert row_hash(GENESIS_HASH, b"bc", "a", tenant_id=None, **common) != row_hash(
        GENESIS_HASH, b"c", "ab", tenant_id=None, **common
    )
    assert row_hash(GENESIS_HASH, b"", "a", tenant_id=None, **common) != row_hash(
        GENESIS_HASH, b"", "a", tenant_id="", **common
    )


def test_messages_become_entries_events_dead_letters_and_invalid_ones() -> None:
    event = new_event(RunQueued(run_id="r1"), tenant_id="acme", correlation_id="r1", producer="t")
    entry = entry_from_message(event.subject, event.to_json_bytes(), stream_seq=7)
    assert (entry.event_id, entry.type, entry.tenant_id, entry.stream_seq) == (
        event.event_id,
        "run.queued",
        "acme",
        7,
    )
    assert entry.payload == event.to_json_bytes()

    letter = DeadLetter(
        service="predictor", subject=event.subject, data=base64.b64encode(event.to_json_bytes()),
        deliveries=5, error="boom",
    ).model_dump_json().encode()  # fmt: skip
    dead = entry_from_message("spec.dlq.predictor", letter)
    assert (dead.type, dead.tenant_id, dead.payload) == ("dlq", "acme", letter)
    assert dead.event_id == raw_event_id("spec.dlq.predictor", letter)  # a redelivery maps to the same id
    record_of_redrive = b'{"letter_seq": 12}'
    redriven = entry_from_message("spec.redriven.predictor.12", record_of_redrive)
    assert (redriven.type, redriven.tenant_id, redriven.payload) == ("dlq.redriven", None, record_of_redrive)

    bad = entry_from_message("spec.run.r1.queued", b'{"type": "run.nope", "tenant_id": "acme"}')
    record = json.loads(bad.payload)
    assert (bad.type, bad.tenant_id) == ("invalid", "acme") and "unknown event type" in record["error"]
    assert base64.b64decode(record["data"]) == b'{"type": "run.nope", "tenant_id": "acme"}'
    assert entry_from_message("spec.dlq.x", b"\xff").tenant_id is None
    # Nested deeper than json.loads can go (a RecursionError underneath): invalid, not a crash.
    nested = entry_from_message("spec.run.r1.requested", b"[" * 5000)
    assert nested.type == "invalid" and "nested too deeply" in json.loads(nested.payload)["error"]
    letter_of_nested = DeadLetter(
        service="predictor", subject="spec.run.r1.requested", data=base64.b64encode(b"[" * 5000),
        deliveries=1, error="malformed",
    ).model_dump_json().encode()  # fmt: skip
    assert entry_from_message("spec.dlq.predictor", letter_of_nested).tenant_id is None


def _stream_of(rows: list[AuditRow]) -> dict[int, tuple[str, bytes]]:
    """The stream messages the rows record, by stream_seq (what `verify --against-stream` reads)."""
    return {r.stream_seq: (r.subject, r.payload) for r in rows if r.stream_seq is not None}


def _check(rows: list[AuditRow], stream: dict[int, tuple[str, bytes]], first_kept_seq: int = 1) -> str:
    checker = StreamChecker(first_kept_seq=first_kept_seq, last_seq=max(stream, default=0))
    for row in rows:
        if not checker.feed(row, None if row.stream_seq is None else stream.get(row.stream_seq)):
            break
    return checker.report().summary()


def test_rows_that_record_their_stream_messages_match() -> None:
    rows = _chain(4, stride=1)
    assert _check(rows, _stream_of(rows)) == "audit log matches the stream: 4 rows"


def test_a_row_rewritten_with_a_recomputed_chain_is_named_by_the_stream() -> None:
    rows = _chain(4, stride=1)
    stream = _stream_of(rows)
    forged = replace(rows[1], payload=rows[1].payload.replace(b'"r2"', b'"r9"'))
    rewritten = [rows[0], forged, *rows[2:]]
    # Rehashed from the forged row on, as audit_row_hash() would: the chain alone is intact.
    prev = rows[0].hash
    for i in range(1, len(rewritten)):
        rewritten[i] = replace(rewritten[i], prev_hash=prev)
        rewritten[i] = replace(rewritten[i], hash=hash_of(rewritten[i]))
        prev = rewritten[i].hash
    assert verify_chain(rewritten, _head(rewritten)).ok
    assert _check(rewritten, stream) == (
        "audit log differs from the stream at seq 2: stream_seq 2: payload differs from the stream's message"
    )


def test_every_stream_message_without_a_row_is_named_as_a_range() -> None:
    rows = _chain(6, stride=1)
    stream = _stream_of(rows)
    missing = "(rows deleted, or not recorded yet)"
    assert _check(rows[:-1], stream).startswith(
        f"audit log misses stream messages 6: no row records them {missing}"
    )
    assert _check([rows[1], rows[4]], stream).startswith("audit log misses stream messages 1, 3..4, 6: ")
    assert _check([], stream).startswith("audit log misses stream messages 1..6: ")
    assert "stream holds no message 30" in _check([*rows[:2], replace(rows[2], stream_seq=30)], stream)
    assert "has no stream_seq" in _check([replace(rows[0], stream_seq=None)], {})


def test_seq_gaps_are_the_ranges_left_out() -> None:
    assert seq_gaps([3, 4, 7, 9], first=1, last=10) == [(1, 2), (5, 6), (8, 8), (10, 10)]
    assert seq_gaps([3, 4, 7]) == [(5, 6)]
    assert seq_gaps([]) == []
    assert seq_gaps([], first=5, last=4) == []  # a purged stream: first = last + 1
    assert seq_gaps([1, 2], first=3, last=3) == [(3, 3)]


def test_plain_verify_names_stream_sequences_missing_between_its_rows() -> None:
    rows = _chain(4, stride=1)
    # The row of stream message 2 deleted and the chain recomputed over the hole.
    relinked = [rows[0], *rows[2:]]
    prev = rows[0].hash
    for i in range(1, len(relinked)):
        relinked[i] = replace(relinked[i], prev_hash=prev)
        relinked[i] = replace(relinked[i], hash=hash_of(relinked[i]))
        prev = relinked[i].hash
    report = verify_chain(relinked, _head(relinked))
    assert not report.ok and report.broken is None and report.gaps == ((2, 2),)
    assert report.summary().startswith("audit chain links but stream sequences 2 have no row")


def test_rows_of_messages_the_stream_retired_at_its_limits_are_counted_not_checked() -> None:
    rows = _chain(4, stride=1)
    # The stream discarded its two oldest messages (max_age or max_bytes).
    kept = {seq: message for seq, message in _stream_of(rows).items() if seq >= 3}
    assert _check(rows, kept, first_kept_seq=3) == (
        "audit log matches the stream: 2 rows (2 older rows not checked: the stream no longer keeps them)"
    )
    # A message missing above the first one kept is still named.
    assert "stream holds no message 4" in _check(rows, {3: kept[3]}, first_kept_seq=3)


def test_a_version_1_run_queued_is_recorded_with_the_bytes_it_was_published_with() -> None:
    # Published before run.queued carried the request (version 1): decoding and
    # re-serialising it must not add the new field, or every old row would differ from
    # its stream message under `verify --against-stream`.
    published = (
        b'{"causation_id":null,"correlation_id":"r1","event_id":"7f0c7a3e-0d7e-4a4e-9a55-1d3c9e0b6a10",'
        b'"occurred_at":"2026-11-20T10:00:00Z","payload":{"run_id":"r1"},"producer":"gateway",'
        b'"schema_version":1,"tenant_id":"acme","type":"run.queued"}'
    )
    entry = entry_from_message("spec.run.r1.queued", published, stream_seq=7)
    assert entry.type == "run.queued" and entry.payload == published
