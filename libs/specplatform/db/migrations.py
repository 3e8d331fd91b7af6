"""Plain numbered SQL migrations (`NNN_name.sql` files in one directory): which exist, which are due.

Pure logic only; `specplatform.db.migrate` applies the plan to a database. specops
keeps its migrations in `schemas/sql` (`specops_schemas.MIGRATIONS`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from speccore.errors import SpecError

_FILENAME = re.compile(r"(?P<version>\d{3})_(?P<name>[a-z0-9_]+)\.sql")


class MigrationError(SpecError):
    """The migration files or the database's migration history are inconsistent."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    checksum: str  # sha256 hex of the file's bytes
    sql: str


def load(directory: Path) -> list[Migration]:
    """Every migration file in version order; a misnamed or duplicate file is an error, not skipped."""
    if not directory.is_dir():
        raise MigrationError(f"migration directory {directory} does not exist")
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILENAME.fullmatch(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNN_lowercase_name.sql")
        data = path.read_bytes()
        migration = Migration(
            version=int(match["version"]),
            name=path.stem,
            checksum=hashlib.sha256(data).hexdigest(),
            sql=data.decode(),
        )
        if migration.version in found:
            raise MigrationError(
                f"{path.name} and {found[migration.version].name}.sql share version {migration.version:03d}"
            )
        found[migration.version] = migration
    return [found[v] for v in sorted(found)]


def pending(available: list[Migration], applied: dict[int, str]) -> list[Migration]:
    """Migrations not yet applied, in order, after checking the recorded history.

    `applied` maps version -> recorded checksum. An applied file that changed or
    disappeared means this code and the database disagree about the schema;
    continuing would leave it in a state no file describes.
    """
    by_version = {m.version: m for m in available}
    for version, checksum in sorted(applied.items()):
        migration = by_version.get(version)
        if migration is None:
            raise MigrationError(
                f"the database has migration {version:03d} applied but no such file exists here "
                "(is this code older than the database?)"
            )
        if migration.checksum != checksum:
            raise MigrationError(
                f"{migration.name}.sql changed after it was applied (checksum {checksum[:12]} recorded, "
                f"{migration.checksum[:12]} now); add a new migration instead of editing an applied one"
            )
    return [m for m in available if m.version not in applied]
