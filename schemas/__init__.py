"""specops_schemas: the wire contract of specops (events, subjects, HTTP bodies).

Everything that crosses a process boundary is a pydantic model here; JSON Schema
and AsyncAPI under ``generated/`` are derived from these models by ``make asyncapi``.
The numbered SQL migrations of the database are under ``sql/`` (MIGRATIONS).
"""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "sql"
