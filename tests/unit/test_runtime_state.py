"""The runtime's bookkeeping without servers: pid records, settings, replica specs, the commands."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specops.commands import db as db_command
from specops.commands import runtime as runtime_command
from specops.runtime.ports import NEAR_PORTS, pick_port, port_free
from specops.runtime.state import ProcessRef, StateDir
from specops.runtime.supervisor import SERVICES, parse_replicas
from specplatform.errors import RuntimeSetupError
from specplatform.settings import (
    RUNTIME_ENV_FILE,
    STATE_DIR_ENV,
    Settings,
    load_settings,
    render_env_file,
    service_settings,
)


def test_a_pid_record_survives_pid_reuse() -> None:
    me = ProcessRef.of(os.getpid())
    assert me.alive()
    # Same pid, other start time: the pid now belongs to another process.
    assert not me.model_copy(update={"create_time": me.create_time - 3600}).alive()


def test_a_finished_process_reads_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcessRef.of(proc.pid)
    proc.wait()
    assert not ref.alive()


def test_a_corrupt_state_file_is_an_error_not_a_guess(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    assert state.load().servers == {}
    state.state_file.write_text("{not json")
    with pytest.raises(RuntimeSetupError, match="unreadable"):
        state.load()


def test_environment_wins_over_runtime_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NATS_URL", "DATABASE_URL", "SPECOPS_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
    socket_dir = '/tmp/with space/and "quote"'
    (tmp_path / RUNTIME_ENV_FILE).write_text(
        render_env_file(
            {"NATS_URL": "nats://127.0.0.1:4333", "DATABASE_URL": f"postgresql:///x?host={socket_dir}"}
        )
    )
    settings = load_settings(tmp_path)
    assert settings.nats_url == "nats://127.0.0.1:4333"
    assert settings.database_url == f"postgresql:///x?host={socket_dir}"
    assert settings.gateway_url == "http://127.0.0.1:8787"
    monkeypatch.setenv("NATS_URL", "nats://bus:4222")
    assert load_settings(tmp_path).nats_url == "nats://bus:4222"


class _KnobSettings(Settings):
    knob: int = 1


def test_a_services_settings_read_its_knobs_and_keep_the_urls_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NATS_URL", "DATABASE_URL", "SPECOPS_KNOB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    (tmp_path / RUNTIME_ENV_FILE).write_text(
        render_env_file({"NATS_URL": "nats://file:4222", "SPECOPS_KNOB": "3"})
    )

    alone = service_settings(_KnobSettings)
    assert (alone.knob, alone.nats_url, alone.state_dir) == (3, "nats://file:4222", tmp_path)
    given = Settings(state_dir=tmp_path, nats_url="nats://given:4222", database_url="postgresql:///given")
    served = service_settings(_KnobSettings, given)
    assert (served.knob, served.nats_url, served.database_url) == (
        3,
        "nats://given:4222",
        "postgresql:///given",
    )
    assert service_settings(_KnobSettings, served) is served


def test_missing_urls_say_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(RuntimeSetupError, match="specops up"):
        load_settings(tmp_path).require_database_url()


def test_replica_specs() -> None:
    counts = parse_replicas(["predictor=3", "audit=0"])
    assert counts == dict.fromkeys(SERVICES, 1) | {"predictor": 3, "audit": 0}
    for bad, message in [("predictor", "SERVICE=N"), ("predictor=-1", "SERVICE=N"), ("nope=2", "unknown")]:
        with pytest.raises(RuntimeSetupError, match=message):
            parse_replicas([bad])
    # Comma lists and repeated flags mix; every service scales, the gateway too.
    counts = parse_replicas(["gateway=2,predictor=2", "benchmark-runner=3"])
    assert counts == dict.fromkeys(SERVICES, 1) | {"gateway": 2, "predictor": 2, "benchmark-runner": 3}
    assert _cli(["up", "--replicas", "audit=2,quality-gate=2", "gateway=2"]).replicas == [
        "audit=2,quality-gate=2",
        "gateway=2",
    ]


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specops")
    sub = parser.add_subparsers(dest="command", required=True)
    runtime_command.add_parsers(sub)
    db_command.add_parsers(sub)
    return parser.parse_args(argv)


def test_status_of_an_empty_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(tmp_path))
    args = _cli(["status", "--json"])
    assert args.handler(args) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["servers"], body["processes"], body["state_dir"]) == ([], [], str(tmp_path))


def test_db_migrate_without_a_database_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECOPS_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    args = _cli(["db", "migrate"])
    with pytest.raises(RuntimeSetupError, match="no database configured"):
        args.handler(args)


def test_a_taken_port_is_replaced_by_a_near_one_not_an_ephemeral_one() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        assert not port_free(taken)
        picked = pick_port(taken)
    assert picked != taken and taken < picked < taken + NEAR_PORTS
