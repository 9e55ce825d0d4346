"""bench.mariadb: a tiny snapshot measurement runs every side and renders its table."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator

import pytest
from tests.engine._binlog import _SERVER_LOCK

from bench import mariadb


@pytest.fixture(autouse=True)
def _server_shared() -> Iterator[None]:
    """Held shared, as every binlog test holds it: a test changing the server's globals
    waits (a backlog read here met "log_bin_compress is ON" once)."""
    with open(_SERVER_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def test_a_tiny_snapshot_measures_floor_combined_and_both_reader_paths(
    mariadb_server_dsn: str,
) -> None:
    out = mariadb.snapshot(mariadb_server_dsn, 300)
    assert out["floor"]["rows"] == 300
    assert out["reader_bulk"] == {**out["reader_bulk"], "rows": 300, "path": "bulk"}
    assert out["reader_rows"] == {**out["reader_rows"], "rows": 300, "path": "rows"}
    assert out["combined"]["wall_s"] > 0 and out["combined"]["cpu_s"] > 0
    # The server runs on the same host: its CPU is measured next to each side's.
    assert all(out[k]["server_cpu_s"] >= 0 for k in ("floor", "combined", "reader_bulk"))
    assert [p[0] for p in out["combined_phases"]["phases"]][:2] == ["open", "start"]
    assert "rows" in out["dlt"] or "unavailable" in out["dlt"]
    lines = mariadb._table({"snapshot": out})
    assert any(line.startswith("| floor: connectorx") for line in lines)
    assert any("reader alone, bulk path, 300 rows" in line for line in lines)
    assert any("phases marked: open" in line for line in lines)


def test_a_tiny_backlog_is_drained_and_read_by_both_decoders(mariadb_server_dsn: str) -> None:
    """The backlog case: one capture, then the binlog reader alone with each decoder.

    Before this change the backlog case measured the capture only.
    """
    out = mariadb.backlog(mariadb_server_dsn, 100)
    assert out["changes"] == 100 and out["lake_equals_source"] is True
    native, library = out["reader_native"], out["reader_library"]
    assert native["rows"] == library["rows"] == 100
    assert native["library_events"] == 0 < library["library_events"]
    lines = mariadb._table({"backlog": out})
    assert any("binlog reader alone, native decoding, 100 rows" in line for line in lines)


def test_a_tiny_cursor_recapture_reads_the_new_rows_on_both_reader_paths(
    mariadb_server_dsn: str,
) -> None:
    out = mariadb.cursor(mariadb_server_dsn, 200, 100)
    assert out["reader_bulk"] == {**out["reader_bulk"], "rows": 200, "path": "bulk"}
    assert out["reader_rows"] == {**out["reader_rows"], "rows": 200, "path": "rows"}
    assert out["combined"]["wall_s"] > 0 and out["combined"]["cpu_s"] > 0
    lines = mariadb._table({"cursor": out})
    assert any("cursor reader alone, bulk path, 200 new rows over 100" in line for line in lines)
