"""The bulk path of a cursor read: the window into Arrow by connectorx, as the row path reads it.

Each read is made twice, through the bulk path (``ext.path == "bulk"``) and
through the row path's keyset pages (``ext.bulk = False``), and the two must
hand over the same rows, the same state and the same totals; where a key
repeats, the same last row of each key.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from combined.connectors.abc import CursorSpec
from combined.connectors.mariadb import MariaDBExtraction, MariaDBSource
from combined.errors import SchemaMismatch

# Every type the connector reads; 10 rows share each cursor value (pages of 7
# rows end inside ties), every 9th row has no cursor, every 7th is all NULLs
# but its id and cursor, zero dates in every 4th row of the NOT NULL dates.
_TABLE = """CREATE TABLE c (
  id BIGINT PRIMARY KEY, v INT NULL, d DECIMAL(12,2), big DECIMAL(38,10),
  huge DECIMAL(65,30), u BIGINT UNSIGNED, f FLOAT, g DOUBLE, bit1 BIT(1), bits BIT(12),
  y YEAR, s VARCHAR(40), tx TEXT, b BLOB, bin BINARY(4), j JSON, e ENUM('a','b'),
  st SET('x','y'), dt DATETIME(6) NOT NULL, ts TIMESTAMP(6) NULL, da DATE NOT NULL,
  tm TIME(3), KEY (v)) ENGINE=InnoDB"""
_FILL = """INSERT INTO c SELECT seq, IF(seq % 9 = 0, NULL, seq DIV 10),
  -seq - 0.99, -1234567890123456789012345678.0123456789 + seq,
  CONCAT('-12345678901234567890123456789012345.', LPAD(seq, 30, '7')),
  18446744073709551615 - seq, seq / 3, -seq / 7, seq % 2, seq % 4096, 1901 + seq % 200,
  CONCAT('héllo 🐬 ', seq), REPEAT('ž', seq * 37), UNHEX(LPAD(HEX(seq), 8, '0')),
  UNHEX('00ff'), JSON_OBJECT('k', seq), ELT(1 + seq % 2, 'a', 'b'), 'x,y',
  IF(seq % 4 = 0, '0000-00-00 00:00:00', TIMESTAMP('2020-02-29 23:59:59.123456')
     + INTERVAL seq SECOND),
  TIMESTAMP('2020-06-01 12:00:00.5') + INTERVAL seq MINUTE,
  IF(seq % 4 = 0, '0000-00-00', DATE('1970-01-01') + INTERVAL seq DAY),
  SEC_TO_TIME(seq * 61.125) FROM seq_1_to_95"""
_NULLED = (
    "UPDATE c SET d = NULL, big = NULL, huge = NULL, u = NULL, f = NULL, g = NULL,"
    " bit1 = NULL, bits = NULL, y = NULL, s = NULL, tx = NULL, b = NULL, bin = NULL,"
    " j = NULL, e = NULL, st = NULL, ts = NULL, tm = NULL WHERE id % 7 = 0"
)


def _read(source: MariaDBSource, request: Any, *, use_bulk: bool) -> tuple[Any, list[Any]]:
    ext = source.read(request)
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = use_bulk
    try:
        msgs = list(ext)
    finally:
        ext.finish("success")
    assert ext.path == ("bulk" if use_bulk else "rows")
    return ext, msgs


def _both(source: MariaDBSource, request: Any, mt: Any) -> tuple[pa.Table, Any, Any]:
    """Read ``request`` by both paths; they agree: (rows, state, control totals)."""
    fast, msgs = _read(source, request, use_bulk=True)
    slow, row_msgs = _read(source, request, use_bulk=False)
    table = mt.table_of(msgs)
    assert table.sort_by("id").equals(mt.table_of(row_msgs).sort_by("id"))
    assert [s.state for s in mt.states(msgs)] == [s.state for s in mt.states(row_msgs)]
    assert [s.position for s in mt.states(msgs)] == [s.position for s in mt.states(row_msgs)]
    assert fast.control_totals == slow.control_totals
    assert fast.receipt.rows == slow.receipt.rows == table.num_rows
    assert max((b.num_rows for b in mt.batches(msgs)), default=0) <= request.batch_rows
    return table, mt.states(msgs)[0], fast.control_totals


def test_a_cursor_read_in_bulk_hands_over_what_the_row_path_does(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql("SET SESSION sql_mode = ''", "SET time_zone = '+05:00'", _TABLE, _FILL, _NULLED)
    spec = CursorSpec("v", nulls="include", lookback=2)
    options = {"page_rows": 7, "zero_dates": "null", "control_totals": "d"}

    def request(state: Any = None) -> Any:
        return make_request(
            "c", strategy="cursor", cursor=spec, state=state, batch_rows=4, options=options
        )

    table, state, totals = _both(source, request(), mt)
    assert table.num_rows == 95 and state.state["cursor"] == 9
    assert totals.rows == 95 and totals.sum is not None and totals.sum.startswith("-")
    first = next(r for r in table.to_pylist() if r["id"] == 1)
    assert (first["id"], first["d"], first["s"]) == (1, Decimal("-1.99"), "héllo 🐬 1")
    assert first["big"] == Decimal("-1234567890123456789012345677.0123456789")
    assert str(first["ts"]) == "2020-06-01 07:01:00.500000+00:00"  # written at +05:00
    assert table.schema.field("huge").type == pa.decimal256(65, 30)
    zero = next(r for r in table.to_pylist() if r["id"] == 4)
    assert zero["dt"] is None and zero["da"] is None  # zero dates, read as NULL
    # The null cursors come last, after the window, on both paths.
    assert table.column("v").to_pylist()[-10:] == [None] * 10
    # Again from the checkpoint: the lookback's window (7, 9] and the null cursors.
    admin.sql("INSERT INTO c (id, v, dt, da) VALUES (1000, 9, NOW(), CURDATE())")
    table, again, totals = _both(source, request(state.state), mt)
    expected = {i for i in range(80, 96) if i % 9} | {1000} | set(range(9, 96, 9))
    assert set(table.column("id").to_pylist()) == expected
    assert again.state["cursor"] == 9 and totals.rows == 96


def test_cursor_policies_and_casts_agree_on_both_paths(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql("SET SESSION sql_mode = ''", _TABLE, _FILL)
    spec = CursorSpec("v", nulls="fail")
    req = make_request("c", strategy="cursor", cursor=spec, options={"zero_dates": "null"})
    for use_bulk in (True, False):
        with pytest.raises(SchemaMismatch, match="10 rows of 'c' hold null in cursor column 'v'"):
            _read(source, req, use_bulk=use_bulk)
    # A zero date read with zero_dates: error fails both paths alike.
    excluded = CursorSpec("v", nulls="exclude")
    req = make_request("c", strategy="cursor", cursor=excluded)
    for use_bulk in (True, False):
        with pytest.raises(SchemaMismatch, match="zero date"):
            _read(source, req, use_bulk=use_bulk)
    casts = {"casts": {"da": "text", "dt": "text"}, "page_rows": 5}
    req = make_request("c", strategy="cursor", cursor=excluded, batch_rows=3, options=casts)
    table, state, _ = _both(source, req, mt)
    assert table.num_rows == 85 and state.state["cursor"] == 9
    assert next(r["da"] for r in table.to_pylist() if r["id"] == 4) == "0000-00-00"


def test_a_datetime_cursor_in_bulk_takes_its_lookback_like_the_row_path(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE e (id INT PRIMARY KEY, v DATETIME(6) NOT NULL, n INT) ENGINE=InnoDB",
        "INSERT INTO e SELECT seq, TIMESTAMP('2026-01-01') + INTERVAL seq DIV 3 MINUTE, seq"
        " FROM seq_1_to_60",
    )
    spec = CursorSpec("v", lookback=timedelta(minutes=2))
    req = make_request("e", strategy="cursor", cursor=spec, options={"page_rows": 4})
    table, state, _ = _both(source, req, mt)
    assert table.num_rows == 60 and state.state["cursor"] == "2026-01-01T00:20:00"
    req = make_request(
        "e", strategy="cursor", cursor=spec, state=state.state, options={"page_rows": 4}
    )
    table, _, _ = _both(source, req, mt)
    assert sorted(table.column("n").to_pylist()) == list(range(57, 61))  # (00:18, 00:20]


def test_a_bulk_cursor_read_sees_only_its_snapshot(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """Rows committed after the read began are in neither its rows, its bound nor its totals."""
    admin.sql(
        "CREATE TABLE o (id BIGINT PRIMARY KEY, v INT NOT NULL, n INT) ENGINE=InnoDB",
        "INSERT INTO o SELECT seq, seq DIV 2, 0 FROM seq_1_to_3000",
    )
    options = {"control_totals": True}
    req = make_request(
        "o", strategy="cursor", cursor=CursorSpec("v"), batch_rows=100, options=options
    )
    ext = source.read(req)
    assert isinstance(ext, MariaDBExtraction)
    it = iter(ext)
    first = next(it)
    admin.sql(
        "INSERT INTO o VALUES (9001, 1, 1), (9002, 5000, 1)",
        "DELETE FROM o WHERE id > 2000",
        "UPDATE o SET n = 9",
    )
    msgs = [first, *it]
    ext.finish("success")
    table = mt.table_of(msgs)
    assert ext.path == "bulk" and table.num_rows == 3000
    assert set(table.column("n").to_pylist()) == {0}
    assert mt.states(msgs)[0].state["cursor"] == 1500
    assert ext.control_totals is not None and ext.control_totals.rows == 3000


def test_a_cursor_read_of_an_empty_window_hands_over_no_batch(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE o (id INT PRIMARY KEY, v INT NULL) ENGINE=InnoDB",
        "INSERT INTO o VALUES (1, 5), (2, NULL)",
    )
    spec = CursorSpec("v", nulls="exclude")
    req = make_request("o", strategy="cursor", cursor=spec, state={"cursor": 5})
    ext, msgs = _read(source, req, use_bulk=True)
    assert mt.batches(msgs) == [] and mt.states(msgs)[0].state["cursor"] == 5
    admin.sql("DELETE FROM o WHERE v = 5")  # no cursor left: no bound, no bulk read
    empty = source.read(make_request("o", strategy="cursor", cursor=spec))
    assert isinstance(empty, MariaDBExtraction)
    msgs = list(empty)
    empty.finish("success")
    assert empty.path == "rows" and mt.batches(msgs) == []


def test_a_cursor_read_without_lock_tables_pages_on_the_row_path(
    admin: Any, mariadb_database: str, make_request: Any, mt: Any
) -> None:
    """No grant to hold the twin snapshot: the keyset pages read, and say why."""
    from tests.connectors.mariadb.test_mariadb_bulk import _grant

    user = f"cbulkcur_{secrets.token_hex(4)}"
    admin.sql(
        f"DROP USER IF EXISTS '{user}'@'%'",
        f"DROP USER IF EXISTS '{user}'@'localhost'",
        f"CREATE USER '{user}'@'%'",
        f"CREATE USER '{user}'@'localhost'",
        "CREATE TABLE o (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
        "INSERT INTO o SELECT seq, seq DIV 3 FROM seq_1_to_20",
    )
    try:
        _grant(admin, user, "SELECT")
        src = MariaDBSource({"dsn": mariadb_database.replace("//root@", f"//{user}@")})
        req = make_request("o", strategy="cursor", cursor=CursorSpec("v"), options={"page_rows": 4})
        try:
            ext = src.read(req)
            assert isinstance(ext, MariaDBExtraction)
            msgs = list(ext)
            ext.finish("success")
            assert ext.path == "rows" and ext.bulk_failure
            assert sorted(mt.table_of(msgs).column("id").to_pylist()) == list(range(1, 21))
            _grant(admin, user, "LOCK TABLES")
            _, msgs = _read(src, req, use_bulk=True)
            assert sorted(mt.table_of(msgs).column("id").to_pylist()) == list(range(1, 21))
        finally:
            src.close()
    finally:
        admin.sql(f"DROP USER IF EXISTS '{user}'@'%'", f"DROP USER IF EXISTS '{user}'@'localhost'")


def test_where_the_key_repeats_the_bulk_window_keeps_the_cursors_order(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    """A key with no unique index behind it: the last row of a key is its latest, on both paths.

    The rows are stored newest first; a window read in storage order would
    hand over each entity's oldest version last, and that one would win.
    """
    admin.sql(
        "CREATE TABLE h (entity INT NOT NULL, v INT NOT NULL, n INT NOT NULL) ENGINE=InnoDB",
        "INSERT INTO h SELECT seq % 7, 1000 - seq, seq FROM seq_1_to_700 ORDER BY seq",
    )
    spec = CursorSpec("v")
    req = make_request("h", strategy="cursor", cursor=spec, key=("entity",), batch_rows=50)
    latest: list[dict[int, int]] = []
    for use_bulk in (True, False):
        _, msgs = _read(source, req, use_bulk=use_bulk)
        table = mt.table_of(msgs)
        assert table.num_rows == 700
        last = dict(
            zip(table.column("entity").to_pylist(), table.column("v").to_pylist(), strict=True)
        )
        latest.append(last)
    assert latest[0] == latest[1] == {0: 993, **{e: 1000 - e for e in range(1, 7)}}


def test_an_ordered_window_that_may_hold_a_row_over_the_packet_limit_pages_by_rows(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # connectorx refuses a row packet over max_allowed_packet, and a row
    # left out of the bulk read and read after it would come out of order.
    half = admin.half_packet()
    admin.sql(
        "CREATE TABLE hl (entity INT NOT NULL, v INT NOT NULL, b LONGBLOB, c LONGTEXT)",
        "INSERT INTO hl SELECT seq % 7, seq, 'b', 'c' FROM seq_1_to_700",
        f"INSERT INTO hl VALUES (3, 5000, REPEAT('b', {half}), REPEAT('c', {half}))",
    )
    req = make_request(
        "hl", strategy="cursor", cursor=CursorSpec("v"), key=("entity",), batch_rows=50
    )
    ext = source.read(req)
    assert isinstance(ext, MariaDBExtraction)
    msgs = list(ext)
    ext.finish("success")
    assert ext.path == "rows" and "too long" in (ext.bulk_failure or "")
    table = mt.table_of(msgs)
    assert table.num_rows == 701 and table.column("v").to_pylist()[-1] == 5000
