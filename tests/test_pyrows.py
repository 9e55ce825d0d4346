"""An Arrow table's rows in Python: dates beyond Python's years as text, the rest as they are."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa

from combined._pyrows import python_ready, python_rows

DAY_10000 = 2_932_897  # 10000-01-01, days since 1970-01-01
DAY_1 = -719_162  # 0001-01-01
LAST_SECOND = 253_402_300_799  # 9999-12-31 23:59:59 UTC


def test_a_column_of_dates_past_9999_or_before_1_reads_as_text() -> None:
    table = pa.table(
        {
            "far": pa.array([DAY_10000, 0], pa.date32()),
            "early": pa.array([DAY_1 - 1, None], pa.date32()),
            "first": pa.array([DAY_1, None], pa.date32()),
            "at": pa.array([(DAY_10000 * 86_400) * 10**6, 0], pa.timestamp("us", "UTC")),
            "ms": pa.array([LAST_SECOND * 1000, None], pa.timestamp("ms")),
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


def test_dates_inside_structs_fixed_lists_and_maps_read_as_text() -> None:
    table = pa.table(
        {
            "s": pa.array(
                [{"x": DAY_10000, "n": 1}], pa.struct([("x", pa.date32()), ("n", pa.int8())])
            ),
            "f": pa.array([[DAY_10000]], pa.list_(pa.date32(), 1)),
            "m": pa.array([[("k", DAY_10000)]], pa.map_(pa.string(), pa.date32())),
        }
    )
    (row,) = python_rows(table)
    assert row == {
        "s": {"x": "10000-01-01", "n": 1},
        "f": ["10000-01-01"],
        "m": [("k", "10000-01-01")],
    }


def test_an_instant_past_9999_in_its_columns_time_zone_reads_as_text() -> None:
    """9999-12-31 20:00 UTC is the year 10000 in Tokyo: the column's zone decides."""
    instant = (LAST_SECOND - 4 * 3600) * 10**6
    table = pa.table(
        {
            "tokyo": pa.array([instant], pa.timestamp("us", "Asia/Tokyo")),
            "utc": pa.array([instant], pa.timestamp("us", "UTC")),
        }
    )
    (row,) = python_rows(table)
    assert row["tokyo"] == "10000-01-01 04:59:59.000000+0900"
    assert row["utc"] == datetime(9999, 12, 31, 19, 59, 59, tzinfo=UTC)


def test_a_table_python_holds_is_left_as_it_is() -> None:
    table = pa.table(
        {
            "d": pa.array([0, None], pa.date32()),
            "ns": pa.array([0, 1000], pa.timestamp("ns", "UTC")),
            "empty": pa.array([None, None], pa.date32()),
        }
    )
    assert python_ready(table).equals(table)
    assert python_rows(table)[0]["ns"] == datetime(1970, 1, 1, tzinfo=UTC)


def test_dates_and_instants_past_arrows_text_and_infinities_read_as_their_text() -> None:
    """Arrow writes no text past some year (``<value out of range: 2145042905>``
    for PostgreSQL's last date): those, and DuckDB's infinities, were printed so."""
    inf_days, inf_count = 2**31 - 1, 2**63 - 1
    table = pa.table(
        {
            "d": pa.array([inf_days, -inf_days, 2_145_042_905, None], pa.date32()),
            "s": pa.array([inf_count, -inf_count, 3_155_760_000_000, None], pa.timestamp("s")),
            "us": pa.array([inf_count, 0, -inf_count, None], pa.timestamp("us", "UTC")),
            "l": pa.array([[inf_days], None, [], [-inf_days, 0]], pa.list_(pa.date32())),
        }
    )
    rows = python_rows(table)
    assert [r["d"] for r in rows] == ["infinity", "-infinity", "5874897-12-31", None]
    assert [r["s"] for r in rows] == ["infinity", "-infinity", "101972-01-21 00:00:00", None]
    assert [r["us"] for r in rows] == [
        "infinity",
        "1970-01-01 00:00:00.000000Z",
        "-infinity",
        None,
    ]
    assert [r["l"] for r in rows] == [["infinity"], None, [], ["-infinity", "1970-01-01"]]
