"""The audit service on a real nats-server and PostgreSQL: recording, the chain, verify, replay."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import psycopg
import pytest
from audit_tamper import delete_with_recomputed_chain, rewrite_with_recomputed_chain
from fixtures.nats import NatsServer

from specbus import SpecBroker, make_broker, publish
from specbus.broker import stream_config
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope, new_event
from specbus.publish import publish_raw
from specbus.subjects import dlq_subject
from specops.cli import main as specops
from specops.runtime.stream import apply_stream_config
from specops_schemas.events import RunQueued, RunRunning
from specops_services.audit import db as audit_db
from specops_services.audit.app import subscribe
from specops_services.audit.logic import AuditEntry, VerifyReport, entry_from_message, raw_event_id
from specplatform.db import create_pool

TENANT = "acme"


POISON_COUNT = 1000


def _run_events(run_id: str) -> list[Envelope[Any]]:
    def event(payload: Any) -> Envelope[Any]:
        return new_event(payload, tenant_id=TENANT, correlation_id=run_id, producer="test")

    return [
        event(RunQueued(run_id=run_id)),
        event(RunRunning(run_id=run_id, stage="predicting")),
        event(RunRunning(run_id=run_id, stage="measuring")),
        event(RunRunning(run_id=run_id, stage="gating")),
    ]


def _entry(event: Envelope[Any]) -> AuditEntry:
    return entry_from_message(event.subject, event.to_json_bytes())


def _rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT seq, event_id::text, subject, type, tenant_id, stream_seq, payload "
            "FROM audit_log ORDER BY seq"
        ).fetchall()


@contextlib.asynccontextmanager
async def _recording(db: str, nats_url: str, run_id: str) -> AsyncIterator[SpecBroker]:
    """An audit recorder on a consumer of its own, running until the block ends; its broker."""
    pool = create_pool(db, max_size=2)
    broker = make_broker(nats_url, service="audit-test")
    subscribe(broker, pool, service=f"audit-test-{run_id}", fetch_timeout_s=0.5)
    await pool.open()
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()
        await pool.close()


async def _verify(dsn: str) -> VerifyReport:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await audit_db.verify(conn)


async def test_bus_messages_are_recorded_in_order_once_with_a_valid_chain(db: str, nats_url: str) -> None:
    run_id = f"audit-{uuid.uuid4().hex[:8]}"
    events = _run_events(run_id)
    letter = (
        DeadLetter(
            service="predictor",
            subject=events[1].subject,
            data=base64.b64encode(events[1].to_json_bytes()),
            deliveries=5,
            error="RuntimeError: boom",
        )
        .model_dump_json()
        .encode()
    )
    malformed = b'{"type": "run.queued", "tenant_id": "acme"'
    bad_subject = f"spec.run.{run_id}.queued"

    async with _recording(db, nats_url, run_id) as broker:
        for event in events:
            await publish(broker, event)
        # The first event again under another Nats-Msg-Id: the stream stores it twice, as
        # it would a re-publish after the dedup window (or a forger reusing its id), and
        # the audit records both messages: it is a copy of the stream, deduplicated by
        # stream sequence, so no message can make it skip another.
        await publish_raw(
            broker, events[0].subject, events[0].to_json_bytes(), {"Nats-Msg-Id": f"again-{run_id}"}
        )
        await publish_raw(broker, dlq_subject("predictor"), letter, {})
        await publish_raw(broker, bad_subject, malformed, {})

        expected = (
            [e.event_id for e in events]
            + [events[0].event_id]
            + [
                raw_event_id(dlq_subject("predictor"), letter),
                raw_event_id(bad_subject, malformed),
            ]
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            rows = [r for r in _rows(db) if r[1] in set(expected)]
            if len(rows) >= len(expected):
                break
            await asyncio.sleep(0.1)

    assert [r[1] for r in rows] == expected  # every message once, in publish order
    stream_seqs = [r[5] for r in rows]
    assert stream_seqs == sorted(stream_seqs) and len(set(stream_seqs)) == len(rows)
    by_id = {r[1]: r for r in rows}
    first = rows[0]
    assert (first[2], first[3], first[4]) == (events[0].subject, "run.queued", TENANT)
    assert bytes(first[6]) == events[0].to_json_bytes()
    dead = by_id[expected[-2]]
    assert (dead[3], dead[4], bytes(dead[6])) == ("dlq", TENANT, letter)
    invalid = by_id[expected[-1]]
    assert invalid[3] == "invalid" and "not JSON" in json.loads(bytes(invalid[6]))["error"]

    report = await _verify(db)
    assert report.ok, report.summary()
    assert report.rows == len(_rows(db))

    # A redelivery of a recorded message (same stream sequence) adds nothing.
    redelivered = entry_from_message(events[1].subject, events[1].to_json_bytes(), stream_seqs[1])
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        assert await audit_db.append(conn, redelivered) is None
    assert len(_rows(db)) == report.rows


async def test_a_thousand_nested_json_messages_are_recorded_as_invalid_and_recording_goes_on(
    db: str, nats_url: str
) -> None:
    run_id = f"nested-{uuid.uuid4().hex[:8]}"
    poison = b"[" * 5000  # deeper than json.loads can go: a RecursionError, not a ValueError
    subject = f"spec.run.{run_id}.requested"
    valid = _run_events(run_id)[0]

    async with _recording(db, nats_url, run_id) as broker:
        for i in range(POISON_COUNT):
            await publish_raw(broker, subject, poison, {"Nats-Msg-Id": f"{run_id}-{i}"})
        await publish(broker, valid)
        deadline = time.monotonic() + 120
        while valid.event_id not in {r[1] for r in _rows(db)}:
            assert time.monotonic() < deadline, "the valid event after the poison was not recorded"
            await asyncio.sleep(0.2)

    recorded = [r for r in _rows(db) if r[2] == subject]
    assert len(recorded) == POISON_COUNT and {r[3] for r in recorded} == {"invalid"}
    assert "nested too deeply" in json.loads(bytes(recorded[0][6]))["error"]
    report = await _verify(db)
    assert report.ok, report.summary()


async def test_concurrent_appenders_keep_one_chain_and_record_an_event_once(db: str) -> None:
    events = [e for i in range(6) for e in _run_events(f"conc-{i}")]
    twice = _entry(events[0])

    async def replica(k: int) -> list[int | None]:
        # One connection each, like replicas; every one of them also gets the same event.
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            return [await audit_db.append(conn, entry) for entry in [*map(_entry, events[k::4]), twice]]

    seqs = [seq for part in await asyncio.gather(*map(replica, range(4))) for seq in part]
    assert sum(seq is not None for seq in seqs) == len(events)
    assert [r[0] for r in _rows(db)] == list(range(1, len(events) + 1))  # no gap, no duplicate
    report = await _verify(db)
    assert report.ok and report.rows == len(events), report.summary()


def _verify_cli(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setenv("DATABASE_URL", dsn)
    code = specops(["audit", "verify"])
    return code, capsys.readouterr().out.strip()


# Each tampering is done as the table owner with the append-only triggers off, as an
# attacker with database access would; (statement, first broken seq, words of the reason).
TAMPERING = {
    "payload": ("UPDATE audit_log SET payload = payload || '\\x20'::bytea WHERE seq = 3", 3, "altered"),
    "subject": ("UPDATE audit_log SET subject = 'spec.run.other.queued' WHERE seq = 3", 3, "altered"),
    "hash": ("UPDATE audit_log SET hash = sha256(hash) WHERE seq = 3", 3, "altered"),
    "deleted": ("DELETE FROM audit_log WHERE seq = 3", 4, "deleted"),
    "deleted_last": ("DELETE FROM audit_log WHERE seq = 5", 5, "deleted at the end"),
    "reordered": (
        "UPDATE audit_log SET seq = 100 WHERE seq = 2; UPDATE audit_log SET seq = 2 WHERE seq = 3; "
        "UPDATE audit_log SET seq = 3 WHERE seq = 100",
        2,
        "reordered",
    ),
}


@pytest.mark.parametrize("kind", TAMPERING)
def test_verify_passes_then_names_the_first_tampered_seq(
    kind: str, db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill() -> None:
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            for event in _run_events("tamper") + _run_events("tamper2")[:1]:
                await audit_db.append(conn, _entry(event))

    asyncio.run(fill())
    code, out = _verify_cli(db, monkeypatch, capsys)
    assert code == 0 and out.startswith("audit chain intact: 5 rows, seq 1..5"), out

    statement, seq, reason = TAMPERING[kind]
    with psycopg.connect(db, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement.split(";")[0])  # the triggers refuse it
        conn.execute("SET session_replication_role = replica")
        conn.execute(statement)

    code, out = _verify_cli(db, monkeypatch, capsys)
    assert code == 1
    assert out.startswith(f"audit chain broken at seq {seq}: ") and reason in out, out
    assert "\n" not in out

    monkeypatch.setenv("DATABASE_URL", db)
    assert specops(["audit", "verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["broken"]["seq"] == seq


def test_verify_without_a_database_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://specops@127.0.0.1:1/specops")
    assert specops(["audit", "verify"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specops: error: cannot connect to the database") and err.count("\n") == 1


async def _publish_for_replay(nats_url: str, run_id: str) -> tuple[list[Envelope[Any]], list[int]]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        events = _run_events(run_id)
        other = _run_events(f"{run_id}-other")[0]
        seqs = []
        for event in [events[0], other, *events[1:]]:
            seqs.append((await publish(js, event)).seq)
    finally:
        await nc.close()
    return events, seqs


def _replay(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert specops(["audit", "replay", *args, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_replay_from_seq_or_time_until_the_end_with_a_subject_filter(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NATS_URL", nats_url)
    run_id = f"replay-{uuid.uuid4().hex[:8]}"
    before = datetime.now(UTC) - timedelta(milliseconds=50)
    events, seqs = asyncio.run(_publish_for_replay(nats_url, run_id))
    mine = [e.event_id for e in events]

    lines = _replay(["--from-seq", str(seqs[0])], capsys)
    assert lines[0]["seq"] == seqs[0]
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)
    assert [line["event_id"] for line in lines if line["event_id"] in mine] == mine
    assert lines[-1]["seq"] >= seqs[-1]  # read to the end of the stream, then stopped
    first = lines[0]
    assert (first["subject"], first["type"], first["tenant_id"]) == (events[0].subject, "run.queued", TENANT)
    assert datetime.fromisoformat(first["time"]) >= before

    since = _replay(["--since", before.isoformat()], capsys)
    assert all(datetime.fromisoformat(line["time"]) >= before for line in since)
    assert [line["event_id"] for line in since if line["event_id"] in mine] == mine

    only = _replay(["--from-seq", "1", "--subject", f"spec.run.{run_id}.*"], capsys)
    assert [line["event_id"] for line in only] == mine

    assert specops(["audit", "replay", "--from-seq", str(seqs[-1]), "--subject", f"spec.run.{run_id}.>"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split() == [str(seqs[-1]), line.split()[1], events[-1].subject, "run.running", mine[-1]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "not a time"),
        (["--since", "2026-11-23T14:00:00"], "no UTC offset"),
        (["--from-seq", "-3"], "stream sequences start at 1"),
        (["--from-seq", "1", "--subject", "run.>"], "not a subject filter"),
        (["--from-seq", "1", "--since", "1h"], "not allowed with"),
    ],
)
def test_replay_rejects_bad_input_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        specops(["audit", "replay", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1, err


def test_replay_without_a_server_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    assert specops(["audit", "replay", "--since", "1h"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("specops: error: cannot connect to NATS at nats://127.0.0.1:1")
        and err.count("\n") == 1
    )


def _record_as_the_audit(db: str, nats_url: str, seqs: list[int]) -> None:
    async def record() -> None:
        # As the audit service records them: each stream message with its sequence.
        nc = await nats.connect(nats_url)
        try:
            async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
                for seq in seqs:
                    msg = await nc.jetstream().get_msg("SPEC", seq=seq)
                    await audit_db.append(conn, entry_from_message(msg.subject or "", msg.data or b"", seq))
        finally:
            await nc.close()

    asyncio.run(record())


def test_a_rewritten_chain_passes_verify_alone_and_is_named_against_the_stream(
    db: str, empty_nats_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"rewrite-{uuid.uuid4().hex[:8]}"
    events, seqs = asyncio.run(_publish_for_replay(empty_nats_url, run_id))
    _record_as_the_audit(db, empty_nats_url, seqs)
    monkeypatch.setenv("DATABASE_URL", db)
    monkeypatch.setenv("NATS_URL", empty_nats_url)
    assert specops(["audit", "verify", "--against-stream"]) == 0
    out = capsys.readouterr().out
    assert f"audit log matches the stream: {len(seqs)} rows" in out, out

    forged = events[1].model_copy(update={"payload": RunRunning(run_id=run_id, stage="gating")})
    rewrite_with_recomputed_chain(db, 3, forged.to_json_bytes())

    assert specops(["audit", "verify"]) == 0  # the chain alone is self-consistent again
    assert capsys.readouterr().out.startswith("audit chain intact")
    assert specops(["audit", "verify", "--against-stream"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("audit chain intact")
    assert out[1] == (
        f"audit log differs from the stream at seq 3: stream_seq {seqs[2]}: "
        "payload differs from the stream's message"
    )


def test_deleting_the_newest_rows_and_moving_the_head_back_is_named_against_the_stream(
    db: str, empty_nats_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, seqs = asyncio.run(_publish_for_replay(empty_nats_url, f"tail-{uuid.uuid4().hex[:8]}"))
    _record_as_the_audit(db, empty_nats_url, seqs)
    monkeypatch.setenv("DATABASE_URL", db)
    monkeypatch.setenv("NATS_URL", empty_nats_url)
    newest = len(seqs)  # the row of the stream's last message

    delete_with_recomputed_chain(db, newest)

    assert specops(["audit", "verify"]) == 0  # nothing among the rows left shows it
    capsys.readouterr()
    assert specops(["audit", "verify", "--against-stream", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True  # the chain itself links
    assert report["stream"]["ok"] is False
    assert report["stream"]["gaps"] == [[seqs[-1], seqs[-1]]]
    assert specops(["audit", "verify", "--against-stream"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"audit log misses stream messages {seqs[-1]}: no row records them"), out


def test_missing_rows_at_the_start_middle_and_end_are_each_named_as_a_range(
    db: str, empty_nats_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, seqs = asyncio.run(_publish_for_replay(empty_nats_url, f"gaps-{uuid.uuid4().hex[:8]}"))
    assert len(seqs) >= 5 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    # Recorded without the first message, the third, and the fifth to the last.
    _record_as_the_audit(db, empty_nats_url, [seqs[1], seqs[3]])
    monkeypatch.setenv("DATABASE_URL", db)
    monkeypatch.setenv("NATS_URL", empty_nats_url)

    # Alone, verify sees the hole among the rows it holds (the chain over them links).
    assert specops(["audit", "verify"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"audit chain links but stream sequences {seqs[2]} have no row"), out

    assert specops(["audit", "verify", "--against-stream", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["gaps"] == [[seqs[2], seqs[2]]]
    assert report["stream"]["gaps"] == [[seqs[0], seqs[0]], [seqs[2], seqs[2]], [seqs[4], seqs[-1]]]
    assert specops(["audit", "verify", "--against-stream"]) == 1
    out = capsys.readouterr().out.splitlines()
    tail = f"{seqs[4]}" if seqs[4] == seqs[-1] else f"{seqs[4]}..{seqs[-1]}"
    assert out[1].startswith(f"audit log misses stream messages {seqs[0]}, {seqs[2]}, {tail}: "), out


def test_the_audit_role_can_insert_but_not_rewrite(db: str) -> None:
    async def append() -> int | None:
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            return await audit_db.append(conn, _entry(_run_events("role")[0]))

    assert asyncio.run(append()) == 1
    for statement in (
        "UPDATE audit_log SET payload = '\\x00'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
        "UPDATE audit_chain_head SET seq = seq + 1",
    ):
        with psycopg.connect(db, autocommit=True) as conn, conn.transaction():
            conn.execute(f"SET LOCAL ROLE {audit_db.WRITER_ROLE}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)


async def test_the_stream_config_update_denies_deletes_and_purges(tmp_path: Any) -> None:
    server = NatsServer(tmp_path)
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        # A stream created before deletes and purges were denied, holding an event.
        await js.add_stream(dataclasses.replace(stream_config(), deny_delete=False, deny_purge=False))
        ack = await publish(js, _run_events("deny")[0])
        await apply_stream_config(server.url)
        info = await js.stream_info("SPEC")
        assert info.config.deny_delete and info.config.deny_purge
        with pytest.raises(nats.js.errors.APIError):
            await js.purge_stream("SPEC")
        with pytest.raises(nats.js.errors.APIError):
            await js.delete_msg("SPEC", ack.seq)
        assert (await js.stream_info("SPEC")).state.messages == 1
        await nc.close()
    finally:
        server.stop()
