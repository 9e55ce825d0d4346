"""Cursor reads of the SQLite connector: upper bound, lookback, checkpoints."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.sqlite import SQLiteSource
from combined.connectors.sqlite._cursor import lower_bound, next_state, shift_iso_text
from combined.errors import ConfigError, SchemaMismatch
from combined.protocol import RecordBatchMessage, StateMessage


def run(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]] | None = None) -> None:
    if rows is None:
        conn.execute(sql)
    else:
        conn.executemany(sql, rows)
    conn.commit()


def database(path: Path, create: str, insert: str, rows: list[tuple[Any, ...]]) -> Path:
    with closing(sqlite3.connect(path)) as conn:
        run(conn, create)
        run(conn, insert, rows)
    return path


def change(path: Path, sql: str) -> None:
    with closing(sqlite3.connect(path)) as conn:
        run(conn, sql)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return database(
        tmp_path / "events.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, seq INT NOT NULL, body TEXT)",
        "INSERT INTO events VALUES (?, ?, ?)",
        [(i, i // 2, f"e{i}") for i in range(1, 11)],
    )


def read(
    path: Path,
    state: Mapping[str, Any] | None,
    cursor: CursorSpec,
    *,
    relation: str = "events",
    key: tuple[str, ...] = ("id",),
    batch_rows: int = 3,
    columns: tuple[str, ...] | None = None,
) -> tuple[Any, StateMessage]:
    source = SQLiteSource({"path": str(path)})
    extraction = source.read(
        ReadRequest(
            dataset=relation,
            relation=relation,
            key=key,
            strategy="cursor",
            cursor=cursor,
            state=state,
            batch_rows=batch_rows,
            columns=columns,
        )
    )
    batches = []
    final = None
    try:
        for message in extraction:
            if isinstance(message, RecordBatchMessage):
                assert message.batch.num_rows <= batch_rows
                batches.append(message.batch)
            else:
                final = message
        assert extraction.receipt.completed
    finally:
        extraction.finish("success")
    assert final is not None and final.final
    table = pa.Table.from_batches(batches) if batches else None
    return table, final


def ids(table: Any) -> list[int]:
    return [] if table is None else table["id"].to_pylist()


def test_first_read_takes_everything_up_to_the_upper_bound(db: Path) -> None:
    table, final = read(db, None, CursorSpec("id", trust="rowid alias"))
    assert ids(table) == list(range(1, 11))
    assert final.state == {"cursor": 10, "trust": "rowid alias"}
    assert final.position == "10"


def test_without_lookback_the_next_read_starts_strictly_after_the_last_value(db: Path) -> None:
    _, first = read(db, None, CursorSpec("id"))
    with closing(sqlite3.connect(db)) as conn:
        run(conn, "INSERT INTO events VALUES (?, ?, ?)", [(i, 100, "new") for i in (11, 12)])
    table, final = read(db, first.state, CursorSpec("id"))
    assert ids(table) == [11, 12]
    assert final.state["cursor"] == 12


def test_lookback_rereads_its_window(db: Path) -> None:
    with closing(sqlite3.connect(db)) as conn:
        run(conn, "INSERT INTO events VALUES (11, 100, 'new')")
    table, final = read(db, {"cursor": 10, "trust": "declared"}, CursorSpec("id", lookback=3))
    # (10 - 3, 11]: the window 8..10 again, then the new row.
    assert ids(table) == [8, 9, 10, 11]
    assert final.state == {"cursor": 11, "trust": "declared"}


def test_rows_come_ordered_by_cursor_then_key(db: Path) -> None:
    table, final = read(db, None, CursorSpec("seq"), batch_rows=2)
    assert table is not None
    pairs = list(zip(table["seq"].to_pylist(), table["id"].to_pylist(), strict=True))
    assert pairs == sorted(pairs)
    assert final.state["cursor"] == 5


def test_no_new_rows_keeps_the_previous_state(db: Path) -> None:
    previous = {"cursor": 10, "trust": "audited", "extra": 1}
    table, final = read(db, previous, CursorSpec("id", trust="declared"))
    assert table is None
    assert final.state == previous
    assert final.position == "10"


def test_an_empty_relation_reads_nothing_and_keeps_no_state(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    with closing(sqlite3.connect(path)) as conn:
        run(conn, "CREATE TABLE events (id INTEGER PRIMARY KEY)")
    table, final = read(path, None, CursorSpec("id"))
    assert table is None
    assert final.state == {}
    assert final.position is None


def test_the_checkpoint_never_moves_backwards(db: Path) -> None:
    with closing(sqlite3.connect(db)) as conn:
        run(conn, "DELETE FROM events WHERE id >= 9")
    table, final = read(db, {"cursor": 10, "trust": "declared"}, CursorSpec("id", lookback=5))
    assert ids(table) == [6, 7, 8]
    assert final.state["cursor"] == 10


@pytest.fixture
def stamped(tmp_path: Path) -> Path:
    path = tmp_path / "stamped.db"
    times = [datetime(2024, 1, 1, 10, m, tzinfo=UTC) for m in range(10)]
    with closing(sqlite3.connect(path)) as conn:
        run(conn, "CREATE TABLE log (id INTEGER PRIMARY KEY, at DATETIME NOT NULL)")
        run(
            conn,
            "INSERT INTO log VALUES (?, ?)",
            [(i, t.strftime("%Y-%m-%d %H:%M:%S")) for i, t in enumerate(times)],
        )
    return path


def test_text_timestamps_take_a_timedelta_lookback(stamped: Path) -> None:
    spec = CursorSpec("at", lookback=timedelta(minutes=2), trust="set by the app on insert")
    table, final = read(stamped, {"cursor": "2024-01-01 10:05:00"}, spec, relation="log")
    assert table is not None
    # (10:03, 10:09]
    assert table["at"].to_pylist()[0] == "2024-01-01 10:04:00"
    assert len(table) == 6
    assert final.state == {"cursor": "2024-01-01 10:09:00", "trust": "set by the app on insert"}
    assert final.position == "2024-01-01 10:09:00"


def test_lookback_must_match_the_cursor_kind(db: Path, stamped: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be a timedelta"):
        read(db, {"cursor": 5}, CursorSpec("id", lookback=timedelta(seconds=1)))
    with pytest.raises(ConfigError, match="must be a timedelta"):
        read(
            stamped,
            {"cursor": "2024-01-01 10:05:00"},
            CursorSpec("at", lookback=60),
            relation="log",
        )
    with pytest.raises(ConfigError, match="negative"):
        read(db, {"cursor": 5}, CursorSpec("id", lookback=-1))


@pytest.mark.parametrize(
    ("text", "delta", "expected"),
    [
        ("2024-01-01 10:05:00", timedelta(minutes=2), "2024-01-01 10:03:00"),
        ("2024-01-01T10:05:00Z", timedelta(hours=11), "2023-12-31T23:05:00Z"),
        ("2024-01-01T10:05:00+02:00", timedelta(seconds=1), "2024-01-01T10:04:59+02:00"),
        ("2024-01-01 10:05:00.250", timedelta(milliseconds=500), "2024-01-01 10:04:59.750"),
        ("2024-01-01 10:05:00.000001", timedelta(microseconds=2), "2024-01-01 10:04:59.999999"),
        ("2024-03-01", timedelta(days=1), "2024-02-29"),
        ("2024-03-01", timedelta(hours=1), "2024-02-29"),  # truncation widens the window
    ],
)
def test_shift_keeps_the_stored_shape(text: str, delta: timedelta, expected: str) -> None:
    assert shift_iso_text(text, delta, "at") == expected


def test_shift_refuses_text_that_is_not_iso() -> None:
    with pytest.raises(ConfigError, match="not iso-8601"):
        shift_iso_text("last tuesday", timedelta(1), "at")


@given(
    moment=st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)),
    delta=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
    fmt=st.sampled_from(["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%d"]),
)
def test_shifted_bound_never_narrows_the_window(
    moment: datetime, delta: timedelta, fmt: str
) -> None:
    text = moment.strftime(fmt)
    bound = shift_iso_text(text, delta, "at")
    exact = datetime.fromisoformat(text) - delta
    # As text (how SQLite compares) and as time, the bound is at or before
    # the exact shift: the lookback may re-read a little more, never less.
    assert bound <= exact.strftime(fmt)
    assert datetime.fromisoformat(bound) <= exact
    assert len(bound) == len(text)


def test_lower_bound_of_numbers() -> None:
    assert lower_bound(10, None, "id") == 10
    assert lower_bound(10, 0, "id") == 10
    assert lower_bound(10, 4, "id") == 6
    assert lower_bound(1.5, 0.5, "x") == 1.0
    with pytest.raises(ConfigError):
        lower_bound(10, "5", "id")
    with pytest.raises(ConfigError):
        lower_bound(10, True, "id")


def test_next_state_rules() -> None:
    spec = CursorSpec("id", trust="t")
    assert next_state(None, 7, 3, spec) == ({"cursor": 7, "trust": "t"}, "7")
    assert next_state({"cursor": 9, "trust": "x"}, 12, 0, spec) == (
        {"cursor": 9, "trust": "x"},
        "9",
    )
    assert next_state(None, None, 0, spec) == ({}, None)


def test_a_fractional_lookback_on_a_large_integer_cursor_keeps_its_window(tmp_path: Path) -> None:
    # 2**53 + 3 minus 1.0 was computed in floating point: 2**53 + 4, above the
    # checkpoint, so the window was empty and the new row 2**53 + 4 was lost.
    base = 2**53
    path = database(
        tmp_path / "big.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, seq INT NOT NULL)",
        "INSERT INTO events VALUES (?, ?)",
        [(1, base + 1), (2, base + 3), (3, base + 4)],
    )
    table, final = read(path, {"cursor": base + 3}, CursorSpec("seq", lookback=1.0))
    assert ids(table) == [2, 3]
    assert final.state["cursor"] == base + 4


def test_a_cursor_holding_numbers_and_text_is_refused(tmp_path: Path) -> None:
    # SQLite sorts every number before any text: max() was the text, and no
    # number written later was ever read again (the checkpoint stayed on it).
    path = database(
        tmp_path / "mixed.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, at DATETIME, seq INT, body TEXT)",
        "INSERT INTO events VALUES (?, ?, ?, ?)",
        [(1, 1_700_000_000, 1, "a"), (2, "2024-01-01 00:00:00", 2, "b")],
    )
    with pytest.raises(SchemaMismatch, match="'at'.*both numbers and text"):
        read(path, None, CursorSpec("at"))
    # Not selected, the cursor's text was never checked at all.
    change(path, "UPDATE events SET seq = 'n/a' WHERE id = 2")
    with pytest.raises(SchemaMismatch, match="'seq'.*both numbers and text"):
        read(path, None, CursorSpec("seq"), columns=("id", "body"))
    # A text checkpoint left by an earlier read finds no number after it.
    change(path, "UPDATE events SET seq = 2 WHERE id = 2")
    with pytest.raises(SchemaMismatch, match="checkpoint 'n/a'"):
        read(path, {"cursor": "n/a"}, CursorSpec("seq"))
    table, final = read(path, {"cursor": 1}, CursorSpec("seq"))
    assert ids(table) == [2] and final.state["cursor"] == 2


def test_a_nocase_text_cursor_reads_each_row_once(tmp_path: Path) -> None:
    # The checkpoint is compared in Python (binary): under the column's NOCASE
    # 'C' sorted after 'b' for sqlite but before it for the checkpoint, which
    # stayed on 'b': every capture read (appended) the 'C' row again.
    path = database(
        tmp_path / "nocase.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, at TEXT COLLATE NOCASE NOT NULL)",
        "INSERT INTO events VALUES (?, ?)",
        [(1, "a"), (2, "b")],
    )
    table, final = read(path, None, CursorSpec("at"))
    assert ids(table) == [1, 2] and final.state["cursor"] == "b"
    change(path, "INSERT INTO events VALUES (3, 'C')")
    table, final = read(path, final.state, CursorSpec("at"))
    assert ids(table) == [3]
    table, final = read(path, final.state, CursorSpec("at"))
    assert ids(table) == []
    assert final.state["cursor"] == "C"


@pytest.fixture
def gaps(tmp_path: Path) -> Path:
    # seq is NULL on rows 3 and 6: no window `lower < seq <= max(seq)` holds them.
    return database(
        tmp_path / "gaps.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, seq INT, body TEXT)",
        "INSERT INTO events VALUES (?, ?, ?)",
        [(i, None if i % 3 == 0 else i * 10, f"e{i}") for i in range(1, 8)],
    )


def test_a_null_cursor_fails_the_read_by_default(gaps: Path) -> None:
    with pytest.raises(SchemaMismatch, match="2 rows of 'events' hold null in cursor column 'seq'"):
        read(gaps, None, CursorSpec("seq"))
    # Only SQL NULL is missing: text such as 'null' is a value (and a column
    # mixing it with numbers is refused as such).
    change(gaps, "UPDATE events SET seq = 'null' WHERE seq IS NULL")
    with pytest.raises(SchemaMismatch, match="both numbers and text"):
        read(gaps, None, CursorSpec("seq"))


def test_null_cursor_rows_included_are_read_by_every_read(gaps: Path) -> None:
    spec = CursorSpec("seq", nulls="include")
    table, first = read(gaps, None, spec)
    assert sorted(ids(table)) == list(range(1, 8))
    assert first.state["cursor"] == 70  # the NULLs move no checkpoint
    change(gaps, "INSERT INTO events VALUES (8, 80, 'e8'), (9, NULL, 'e9')")
    table, final = read(gaps, first.state, spec)
    assert sorted(ids(table)) == [3, 6, 8, 9]
    assert final.state["cursor"] == 80
    table, again = read(gaps, final.state, spec)
    assert sorted(ids(table)) == [3, 6, 9] and again.state == final.state


def test_a_relation_whose_cursor_is_all_null_reads_them_and_keeps_no_checkpoint(
    tmp_path: Path,
) -> None:
    path = database(
        tmp_path / "nulls.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, seq INT)",
        "INSERT INTO events VALUES (?, ?)",
        [(1, None), (2, None)],
    )
    table, final = read(path, None, CursorSpec("seq", nulls="include"))
    assert ids(table) == [1, 2]
    assert final.state == {} and final.position is None
    table, final = read(path, None, CursorSpec("seq", nulls="exclude"))
    assert table is None and final.state == {}


def test_null_cursor_rows_excluded_are_never_read(gaps: Path) -> None:
    table, final = read(gaps, None, CursorSpec("seq", nulls="exclude"))
    assert ids(table) == [1, 2, 4, 5, 7]
    assert final.state["cursor"] == 70


def _read_knowing(path: Path, state: Mapping[str, Any], lake: list[str]) -> list[int]:
    source = SQLiteSource({"path": str(path)})
    request = ReadRequest(
        dataset="events",
        relation="events",
        key=("id",),
        strategy="cursor",
        cursor=CursorSpec(column="seq"),
        state=state,
        options={"lake_columns": lake},
    )
    extraction = source.read(request)
    try:
        batches = [m.batch for m in extraction if isinstance(m, RecordBatchMessage)]
    finally:
        extraction.finish("success")
    return sorted(i for b in batches for i in b.column("id").to_pylist())


def test_a_column_new_to_the_lake_filled_below_the_checkpoint_is_read_on_every_row(
    db: Path,
) -> None:
    # A default gave every older row a value: read past the checkpoint alone,
    # they kept NULL in the lake.
    _, state = read(db, None, CursorSpec(column="seq"))
    known = ["id", "seq", "body"]
    change(db, "ALTER TABLE events ADD COLUMN note TEXT")  # null below: nothing more to read
    change(db, "INSERT INTO events (id, seq, body) VALUES (11, 6, 'e11')")
    assert _read_knowing(db, state.state, known) == [11]
    change(db, "ALTER TABLE events ADD COLUMN flag INT NOT NULL DEFAULT 7")
    assert _read_knowing(db, state.state, [*known, "note"]) == list(range(1, 12))
    assert _read_knowing(db, state.state, [*known, "note", "flag"]) == [11]
