"""A small reduction's DuckDB database is kept for the next one, emptied; a spilled one is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from tests.runtime.test_reduce_streamed import CONSTANTS, new_reducer, staged

from combined.capture import _databases, _reduce


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each reduction's DuckDB database opened from here on (none kept before)."""
    monkeypatch.setattr(_databases, "_KEPT", _databases.KeptDatabase())
    made: list[Any] = []
    connect = duckdb.connect

    def counted(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        if "temp_directory" in (kwargs.get("config") or {}):  # (not a stager's)
            made.append(kwargs["config"])
        return connect(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counted)
    return made


def test_small_reductions_one_after_another_open_one_database(
    tmp_path: Path, opened: list[Any]
) -> None:
    # Opening one costs ~15 ms of CPU: most of a small table's reduction.
    parts, schema = staged(tmp_path, list(range(3000)))
    first = new_reducer(tmp_path / "a", parts, schema)
    try:
        assert first.reduce().inserts == 3000
        current = tmp_path / "current.parquet"
        pq.write_table(duckdb_free_rows(first), current)
    finally:
        first.close()
    again, _ = staged(tmp_path, list(range(100, 3100)), tag="m")
    second = new_reducer(tmp_path / "b", again, schema, current=[str(current)])
    try:
        assert second.con.execute("SELECT current_setting('temp_directory')").fetchall() == [
            (str(tmp_path / "b"),)
        ]
        t = second.reduce()
        assert (t.inserts, t.updates, t.deletes) == (
            100,
            2320,
            100,
        )  # (a fifth of the names are null on both sides)
    finally:
        second.close()
    assert len(opened) == 1
    kept = _databases._KEPT.held
    assert kept is not None
    assert kept.execute("SELECT count(*) FROM duckdb_tables()").fetchall() == [(0,)]
    assert kept.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall() == [
        (0,)
    ]


def duckdb_free_rows(r: _reduce.Reducer) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))


def test_a_database_that_spilled_or_read_a_large_capture_is_closed(
    tmp_path: Path, opened: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    database = _databases.open_database(64, tmp_path / "spill")
    database.execute(
        "CREATE TABLE t AS SELECT range AS x, md5(range::VARCHAR) AS h FROM range(3000000)"
    )
    assert database.execute("SELECT count(*) FROM (SELECT h FROM t ORDER BY h)").fetchall()
    _databases.close_database(database, keep=True)
    assert _databases._KEPT.held is None  # (its spill directory could not move)
    monkeypatch.setattr(_reduce, "KEEP_STAGED_BYTES", 0)
    parts, schema = staged(tmp_path, list(range(10)))
    r = new_reducer(tmp_path, parts, schema)
    r.reduce()
    r.close()
    assert _databases._KEPT.held is None and len(opened) == 2
