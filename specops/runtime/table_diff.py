"""Row-by-row comparison of the live tables with the ones rebuilt from the stream (pure, no I/O).

`specops audit diff` reads both databases with `TABLES` and prints what `diff_rows`
finds: a row only one side has, or a column whose values differ. Only the columns that
carry meaning are compared; pure bookkeeping (`runs.created_at` / `updated_at`, which
the database stamps when the gateway writes the row) is left out, while the times that
say when something happened (a rep's `recorded_at`, a verdict's `evaluated_at`, the
winner's `created_at` and expiry) are written from the events' `occurred_at` and
compared like any column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specops_services.gateway.winner_cache import KEY_COLUMNS

# Longest value printed in a difference line; jsonb columns can be kilobytes.
SHOWN_CHARS = 160


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table as compared: its key columns and the columns that carry meaning."""

    name: str
    key: tuple[str, ...]
    columns: tuple[str, ...]


TABLES = (
    TableSpec(
        "runs", ("id",), ("tenant_id", "status", "request", "result", "error", "cache_hit", "measured")
    ),
    TableSpec("run_events", ("event_id",), ("run_id", "seq", "type", "payload", "occurred_at")),
    TableSpec("tune_sessions", ("id",), ("tenant_id", "run_id", "status", "session", "source", "created_at")),
    TableSpec("tune_session_events", ("event_id",), ("session_id", "seq", "type", "payload", "occurred_at")),
    TableSpec(
        "candidates", ("run_id", "candidate_id"), ("rank", "family", "candidate", "prediction", "created_at")
    ),
    TableSpec(
        "bench_results",
        ("bench_id", "candidate_id", "rep"),
        ("run_id", "metrics", "tokens_per_s", "speedup", "recorded_at"),
    ),
    TableSpec(
        "gate_results",
        ("bench_id", "candidate_id"),
        ("run_id", "method", "passed", "score", "threshold", "details", "evaluated_at"),
    ),
    TableSpec(
        "datastores",
        ("id",),
        (
            "tenant_id",
            "name",
            "sha256",
            "size_bytes",
            "format",
            "documents",
            "fingerprints",
            "path",
            "created_at",
        ),
    ),
    TableSpec("heads", ("id",), ("tenant_id", "state", "target", "family", "head", "created_at")),
    TableSpec("head_events", ("event_id",), ("head_id", "seq", "type", "payload", "occurred_at")),
    TableSpec(
        "speculative_head_approvals",
        ("event_id",),
        ("head_id", "tenant_id", "from_state", "to_state", "actor", "role", "rationale", "approved_at"),
    ),
    TableSpec(
        "winner_cache",
        KEY_COLUMNS,
        ("winner", "candidates", "pareto_front", "measured", "source_run_id", "created_at", "expires_at"),
    ),
)


@dataclass(frozen=True, slots=True)
class Difference:
    """One row missing on a side (`column` None), or one column that differs."""

    table: str
    key: tuple[Any, ...]
    column: str | None
    live: Any
    rebuilt: Any

    def line(self) -> str:
        key = "/".join(str(part) for part in self.key)
        if self.column is None:
            side = "live" if self.rebuilt is None else "rebuilt"
            return f"{self.table} {key}: only in the {side} database"
        live, rebuilt = _shown(self.live), _shown(self.rebuilt)
        return f"{self.table} {key}: {self.column}: live {live} != rebuilt {rebuilt}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "key": [str(part) for part in self.key],
            "column": self.column,
            "live": _shown(self.live),
            "rebuilt": _shown(self.rebuilt),
        }


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def diff_rows(
    spec: TableSpec, live: Iterable[Mapping[str, Any]], rebuilt: Iterable[Mapping[str, Any]]
) -> list[Difference]:
    """Every difference between two sets of rows of `spec`'s table, in key order."""
    live_rows = _by_key(spec, live)
    rebuilt_rows = _by_key(spec, rebuilt)
    found = []
    for key in sorted(live_rows.keys() | rebuilt_rows.keys(), key=lambda k: tuple(map(str, k))):
        mine, theirs = live_rows.get(key), rebuilt_rows.get(key)
        if mine is None or theirs is None:
            found.append(Difference(spec.name, key, None, mine, theirs))
            continue
        found.extend(
            Difference(spec.name, key, column, mine[column], theirs[column])
            for column in spec.columns
            if mine[column] != theirs[column]
        )
    return found


def _by_key(spec: TableSpec, rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], Mapping[str, Any]]:
    keyed: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = tuple(row[column] for column in spec.key)
        if key in keyed:
            raise ValueError(f"{spec.name}: two rows share the key {key}")
        keyed[key] = row
    return keyed
