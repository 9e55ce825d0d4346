"""ADBC without its DB-API module: the behaviours the connectors rely on, on real drivers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import adbc_driver_postgresql
import adbc_driver_sqlite
import pyarrow as pa
import pytest

from combined.connectors import _adbc


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, x REAL)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, f"n{i}", i / 2) for i in range(1, 101)])
    con.commit()
    con.close()
    return path


def _open(path: Path) -> _adbc.Connection:
    return _adbc.Connection(adbc_driver_sqlite.connect(path.as_uri() + "?mode=ro"))


def test_rows_parameters_and_a_reused_statement(db: Path) -> None:
    with _open(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, x FROM t WHERE id <= ? AND name <> ? ORDER BY id", (3, "n2"))
        assert cur.fetchall() == [(1, "n1", 0.5), (3, "n3", 1.5)]
        # The same SQL again (not prepared twice), other parameters.
        cur.execute("SELECT id, name, x FROM t WHERE id <= ? AND name <> ? ORDER BY id", (2, "n1"))
        assert cur.fetchall() == [(2, "n2", 1.0)]
        cur.execute("SELECT count(*) AS n FROM t WHERE name IS ?", (None,))
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 0}]


def test_a_stream_in_bounded_batches_and_closing_with_it_open(db: Path) -> None:
    conn = _open(db)
    cur = conn.cursor({adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: "7"})
    cur.execute("SELECT id FROM t ORDER BY id")
    reader = cur.fetch_record_batch()
    assert isinstance(reader, pa.RecordBatchReader)
    first = reader.read_next_batch()
    assert first.num_rows == 7
    # Closing the connection closes its cursor (and the unread stream) first.
    conn.close()
    conn.close()  # idempotent
    with pytest.raises(_adbc.Error):
        cur.execute("SELECT 1")


def test_a_result_is_read_once(db: Path) -> None:
    with _open(db) as conn, conn.cursor() as cur:
        with pytest.raises(_adbc.Error, match="the result is closed"):
            cur.fetchall()  # nothing executed
        cur.execute("SELECT id FROM t")
        assert cur.fetch_arrow_table().num_rows == 100
        assert cur.fetchall() == []  # consumed, as the DB-API leaves it


def test_a_postgres_failure_mid_result_keeps_its_sqlstate(pg_database: str) -> None:
    # A division by zero at the third row: the error surfaces while the rows
    # are read, and the driver's SQLSTATE (22012) must reach the caller.
    with _adbc.Connection(adbc_driver_postgresql.connect(pg_database)) as conn:
        cur = conn.cursor()
        with pytest.raises(_adbc.Error) as info:
            cur.execute("SELECT 1 / (3 - g) FROM generate_series(1, 5) g")
            cur.fetchall()
        assert getattr(info.value, "sqlstate", None) == "22012"
