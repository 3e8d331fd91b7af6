"""Which migration files exist and which are due (no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops_schemas import MIGRATIONS
from specplatform.db.migrations import MigrationError, load, pending


def _write(directory: Path, **files: str) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_files_load_in_version_order(tmp_path: Path) -> None:
    directory = _write(tmp_path / "sql", **{"010_later.sql": "b", "002_first.sql": "a"})
    assert [(m.version, m.name) for m in load(directory)] == [(2, "002_first"), (10, "010_later")]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"1_short.sql": ""}, "NNN_lowercase_name.sql"),
        ({"001_Upper.sql": ""}, "NNN_lowercase_name.sql"),
        ({"001_a.sql": "", "001_b.sql": ""}, "share version 001"),
    ],
)
def test_misnamed_or_duplicate_files_are_refused(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(MigrationError, match=message):
        load(_write(tmp_path / "sql", **files))


def test_pending_skips_applied_and_checks_their_checksums(tmp_path: Path) -> None:
    first, second = load(_write(tmp_path / "sql", **{"001_a.sql": "x", "002_b.sql": "y"}))
    assert pending([first, second], {}) == [first, second]
    assert pending([first, second], {1: first.checksum}) == [second]
    with pytest.raises(MigrationError, match="001_a.sql changed"):
        pending([first, second], {1: "0" * 64})
    with pytest.raises(MigrationError, match="no such file"):
        pending([first], {1: first.checksum, 2: second.checksum})


def test_the_shipped_migrations_load() -> None:
    names = [m.name for m in load(MIGRATIONS)]
    assert names[0] == "001_core"
