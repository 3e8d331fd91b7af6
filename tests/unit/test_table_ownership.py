"""One writer per table: the SQL in services/ and libs/ writes each table from one place only,
the owner services/README.md names ("Table ownership"), and every owner's writes are seen.

A library function or class whose SQL writes a table its caller names (`sql.SQL("INSERT INTO
{t}")`, specplatform.db.opt_out.OptOuts) writes for that caller: a call that passes it a
table's name as a string constant is the caller's write."""

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
_PARAMETRISED_WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+\{\w*\}|\bUPDATE\s+\{\w*\}\s+SET\b",
    re.IGNORECASE,
)
_CREATE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_ROW = re.compile(r"^\|\s*`(\w+)`\s*\|\s*(?:`(\w+)`|(nobody))")
# Written by a trigger of another table's, not by a statement of its owner's code.
_MOVED_BY_TRIGGER = {"audit_chain_head"}


def writer_of(path: Path) -> str:
    """The service (services/<name>/) or library (libs/<name>/) a source file belongs to."""
    parts = path.relative_to(ROOT).parts
    return parts[1]


def sources() -> dict[str, str]:
    """Every Python file that may hold SQL, by its path from the repository root."""
    files = [*(ROOT / "services").rglob("*.py"), *(ROOT / "libs").rglob("*.py")]
    return {str(path.relative_to(ROOT)): path.read_text() for path in sorted(files)}


def _strings(tree: ast.AST) -> list[str]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def parametrised_writers(trees: Mapping[str, ast.Module]) -> set[tuple[str, str]]:
    """(module, name) of every function, and class, whose SQL writes the table its caller names."""
    return {
        (Path(path).stem, node.name)
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and any(_PARAMETRISED_WRITE.search(text) for text in _strings(node))
    }


def _calls_to(tree: ast.AST, functions: set[tuple[str, str]]) -> list[ast.Call]:
    """Calls of `functions`, as `module.function(...)` or, imported, `function(...)`."""
    names = {name for _, name in functions}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if (func.value.id, func.attr) in functions:
                calls.append(node)
        elif isinstance(func, ast.Name) and func.id in names:
            calls.append(node)
    return calls


def table_writers(files: Mapping[str, str], tables: set[str]) -> dict[str, set[str]]:
    """table -> the services and libraries whose SQL writes it (files: path -> source)."""
    trees = {path: ast.parse(source) for path, source in files.items()}
    parametrised = parametrised_writers(trees)
    writers: dict[str, set[str]] = {}
    for path, tree in trees.items():
        named = [
            match.group(1) or match.group(2) for text in _strings(tree) for match in _WRITE.finditer(text)
        ]
        for call in _calls_to(tree, parametrised):
            named += [
                arg.value
                for arg in [*call.args, *(keyword.value for keyword in call.keywords)]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            ]
        for table in named:
            if table.lower() in tables:
                writers.setdefault(table.lower(), set()).add(writer_of(ROOT / path))
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


def test_every_owners_writes_are_seen() -> None:
    # A table whose writes the scan cannot see would pass the test above whoever wrote it.
    owners = readme_owners()
    writers = table_writers(sources(), schema_tables() | set(owners))
    owned = {t for t, owner in owners.items() if owner != "nobody"} - _MOVED_BY_TRIGGER
    assert sorted(owned - set(writers)) == []


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


def test_a_write_through_a_library_is_its_callers() -> None:
    files = {
        "libs/specplatform/db/opt_out.py": (
            "async def record(conn, table, tenant_id):\n"
            '    await conn.execute(sql.SQL("INSERT INTO {t} VALUES (%s)").format(t=table), (tenant_id,))\n'
            "async def disabled(conn, table, tenant_id):\n"
            '    await conn.execute(sql.SQL("SELECT 1 FROM {t}").format(t=table))\n'
            "class OptOuts:\n"
            "    async def fold(self, conn, tenant_id):\n"
            '        await conn.execute(sql.SQL("UPDATE {t} SET version = 1").format(t=self.table))\n'
            "class Reader:\n"
            "    async def read(self, conn):\n"
            '        await conn.execute(sql.SQL("SELECT 1 FROM {t}").format(t=self.table))\n'
        ),
        "services/predictor/db.py": (
            "async def save(conn, tenant_id):\n"
            '    await opt_out.record(conn, "predictor_policies", tenant_id)\n'
            '    await opt_out.disabled(conn, "tuner_policies", tenant_id)\n'
        ),
        "services/gateway/db.py": 'record(conn, table="predictor_policies", tenant_id="acme")\n',
        "services/tuner/db.py": 'POLICIES = opt_out.OptOuts("tuner_policies")\nREAD = Reader("audit_log")\n',
    }
    writers = table_writers(files, {"predictor_policies", "tuner_policies", "audit_log"})
    # A read through the library (`disabled`, `Reader`) is no write.
    assert writers == {"predictor_policies": {"gateway", "predictor"}, "tuner_policies": {"tuner"}}
