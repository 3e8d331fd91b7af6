"""The rebuild's row-by-row comparison (specops.runtime.table_diff), on plain rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specops.runtime.table_diff import TABLES, TableSpec, diff_rows

SPEC = TableSpec("gate_results", ("bench_id", "candidate_id"), ("passed", "details", "evaluated_at"))
AT = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)


def _row(candidate: str, **values: object) -> dict[str, object]:
    row = {"bench_id": "b1", "candidate_id": candidate, "passed": True, "details": {"k": 1}}
    return row | {"evaluated_at": AT} | values


def test_equal_rows_in_any_order_have_no_difference() -> None:
    live = [_row("a"), _row("b", passed=False)]
    assert diff_rows(SPEC, live, list(reversed(live))) == []


def test_a_changed_column_is_named_with_both_values() -> None:
    (found,) = diff_rows(SPEC, [_row("a"), _row("b")], [_row("a"), _row("b", details={"k": 2})])
    assert (found.table, found.key, found.column) == ("gate_results", ("b1", "b"), "details")
    assert found.line() == "gate_results b1/b: details: live {'k': 1} != rebuilt {'k': 2}"


def test_rows_only_one_side_has_are_named_by_side_in_key_order() -> None:
    found = diff_rows(SPEC, [_row("c"), _row("a")], [_row("b")])
    assert [d.line() for d in found] == [
        "gate_results b1/a: only in the live database",
        "gate_results b1/b: only in the rebuilt database",
        "gate_results b1/c: only in the live database",
    ]


def test_columns_left_out_of_the_spec_are_not_compared() -> None:
    assert diff_rows(SPEC, [_row("a", updated_at=AT)], [_row("a", updated_at=datetime.now(UTC))]) == []


def test_long_values_are_shortened_in_the_line() -> None:
    (found,) = diff_rows(SPEC, [_row("a", details={"x": "y" * 1000})], [_row("a")])
    assert len(found.line()) < 400 and "... != rebuilt" in found.line()
    assert found.to_dict()["column"] == "details"


def test_two_rows_under_one_key_are_an_error() -> None:
    with pytest.raises(ValueError, match="share the key"):
        diff_rows(SPEC, [_row("a"), _row("a")], [])


def test_the_compared_tables_leave_out_pure_bookkeeping() -> None:
    by_name = {spec.name: spec for spec in TABLES}
    assert set(by_name) == {
        "runs", "run_events", "candidates", "bench_results", "gate_results", "datastores", "winner_cache",
        "tune_sessions", "tune_session_events", "heads", "head_events", "speculative_head_approvals",
    }  # fmt: skip
    assert not {"created_at", "updated_at"} & set(by_name["runs"].columns)
    # A session's created_at is its tune.requested's time, written from the event; updated_at is not.
    assert "updated_at" not in by_name["tune_sessions"].columns
    assert "recorded_at" in by_name["bench_results"].columns  # when the rep was measured: the event's time
