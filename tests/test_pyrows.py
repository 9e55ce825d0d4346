"""An Arrow table's rows in Python: dates beyond Python's years as text, the rest as they are."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa

from combined._pyrows import python_ready, python_rows

DAY_10000 = 2_932_897  # 10000-01-01, days since 1970-01-01
DAY_1 = -719_162  # 0001-01-01


def test_a_column_of_dates_past_9999_or_before_1_reads_as_text() -> None:
    table = pa.table(
        {
            "far": pa.array([DAY_10000, 0], pa.date32()),
            "early": pa.array([DAY_1 - 1, None], pa.date32()),
            "first": pa.array([DAY_1, None], pa.date32()),
            "at": pa.array([(DAY_10000 * 86_400) * 10**6, 0], pa.timestamp("us", "UTC")),
            "ms": pa.array([(DAY_10000 * 86_400 - 1) * 1000, None], pa.timestamp("ms")),
            "lists": pa.array([[DAY_10000], []], pa.list_(pa.date32())),
            "fine": pa.array([[0], None], pa.list_(pa.date32())),
        }
    )
    rows = python_rows(table)
    assert rows[0]["far"] == "10000-01-01" and rows[1]["far"] == "1970-01-01"
    assert rows[0]["early"] == "0000-12-31" and rows[1]["early"] is None
    assert rows[0]["first"] == date(1, 1, 1)  # the first day Python holds stays a date
    assert rows[0]["at"].startswith("10000-01-01") and rows[1]["at"].startswith("1970-01-01")
    assert rows[0]["ms"] == datetime(9999, 12, 31, 23, 59, 59)  # the last second stays
    assert rows[0]["lists"] == ["10000-01-01"] and rows[1]["lists"] == []
    assert rows[0]["fine"] == [date(1970, 1, 1)] and rows[1]["fine"] is None


def test_a_table_within_pythons_years_is_left_as_it_is() -> None:
    table = pa.table(
        {
            "d": pa.array([0, None], pa.date32()),
            "ns": pa.array([0, 1000], pa.timestamp("ns", "UTC")),
            "empty": pa.array([None, None], pa.date32()),
        }
    )
    assert python_ready(table) is table
    assert python_rows(table)[0]["ns"] == datetime(1970, 1, 1, tzinfo=UTC)
