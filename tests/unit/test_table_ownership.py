"""One writer per table: the SQL in services/ and libs/ writes each table from one place only,
the owner services/README.md names ("Table ownership")."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "services" / "README.md"
SQL_DIR = ROOT / "schemas" / "sql"

# INSERT INTO t, UPDATE t SET, DELETE FROM t, TRUNCATE [TABLE] t; an upsert's
# ON CONFLICT ... DO UPDATE SET belongs to its INSERT INTO. Read from string literals
# only, so a comment that names a statement is no write.
_WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+(\w+)|\bUPDATE\s+(\w+)\s+SET\b", re.IGNORECASE
)
_CREATE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_ROW = re.compile(r"^\|\s*`(\w+)`\s*\|\s*(?:`(\w+)`|(nobody))")


def writer_of(path: Path) -> str:
    """The service (services/<name>/) or library (libs/<name>/) a source file belongs to."""
    parts = path.relative_to(ROOT).parts
    return parts[1]


def sources() -> dict[str, str]:
    """Every Python file that may hold SQL, by its path from the repository root."""
    files = [*ROOT.glob("services/*/*.py"), *(ROOT / "libs").rglob("*.py")]
    return {str(path.relative_to(ROOT)): path.read_text() for path in sorted(files)}


def _strings(source: str) -> list[str]:
    return [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def table_writers(files: Mapping[str, str], tables: set[str]) -> dict[str, set[str]]:
    """table -> the services and libraries whose SQL writes it (files: path -> source)."""
    writers: dict[str, set[str]] = {}
    for path, source in files.items():
        for text in _strings(source):
            for match in _WRITE.finditer(text):
                table = (match.group(1) or match.group(2)).lower()
                if table in tables:
                    writers.setdefault(table, set()).add(writer_of(ROOT / path))
    return writers


def schema_tables() -> set[str]:
    return {m.lower() for path in SQL_DIR.glob("*.sql") for m in _CREATE.findall(path.read_text())}


def readme_owners() -> dict[str, str]:
    """table -> owner of the README's "Table ownership" section ('nobody' for reference data)."""
    text = README.read_text()
    section = text.split("## Table ownership", 1)[1].split("\n## ", 1)[0]
    owners = {}
    for line in section.splitlines():
        row = _ROW.match(line)
        if row:
            owners[row.group(1)] = row.group(2) or row.group(3)
    return owners


def problems(writers: Mapping[str, set[str]], owners: Mapping[str, str]) -> list[str]:
    """Every way the code's writers and the README's owners disagree."""
    found = []
    for table, who in sorted(writers.items()):
        if len(who) > 1:
            found.append(f"{table} has {len(who)} writers, {sorted(who)}: the others must learn by events")
        elif table not in owners:
            found.append(f"{table} is written by {sorted(who)} but has no row in services/README.md")
        elif who != {owners[table]}:
            found.append(f"{table} is written by {sorted(who)}, but services/README.md names {owners[table]}")
    return found


def test_every_table_of_the_schema_has_an_owner_in_the_readme() -> None:
    owners = readme_owners()
    assert schema_tables() <= set(owners), sorted(schema_tables() - set(owners))


def test_each_table_is_written_by_its_owner_alone() -> None:
    owners = readme_owners()
    writers = table_writers(sources(), schema_tables() | set(owners))
    assert problems(writers, owners) == []
    # Reference data is written by its migration only.
    assert not {t for t, owner in owners.items() if owner == "nobody"} & set(writers)


def test_a_second_writer_is_caught() -> None:
    # The predictor's old copy of the quality gate's upsert, in a comment and in SQL.
    files = {
        "services/quality_gate/db.py": '_SAVE = "INSERT INTO gate_results (bench_id) VALUES (%s)"\n',
        "services/predictor/db.py": (
            "# INSERT INTO winner_cache is the gateway's\n"
            'SAVE = """INSERT INTO gate_results (bench_id) VALUES (%s)\n'
            '          ON CONFLICT (bench_id) DO UPDATE SET bench_id = EXCLUDED.bench_id"""\n'
            'MARK = "update benches set verdicts = %s"\n'
        ),
    }
    writers = table_writers(files, {"gate_results", "benches", "winner_cache"})
    assert writers == {"gate_results": {"predictor", "quality_gate"}, "benches": {"predictor"}}
    assert problems(writers, {"gate_results": "quality_gate", "benches": "predictor"}) == [
        "gate_results has 2 writers, ['predictor', 'quality_gate']: the others must learn by events"
    ]
    assert problems({"benches": {"gateway"}}, {"benches": "predictor"}) == [
        "benches is written by ['gateway'], but services/README.md names predictor"
    ]
