"""Snapshot and cursor reads: one consistent snapshot, keyset pages, lookback, control totals."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from combined.connectors.abc import CursorSpec
from combined.connectors.mariadb import (
    CONSISTENT_SNAPSHOT,
    SERVER_CLOCK,
    ControlTotals,
    MariaDBExtraction,
    MariaDBSource,
)
from combined.errors import ConfigError, NotFoundError, ProtocolViolation, SchemaMismatch
from combined.protocol import RecordBatchMessage


def _orders(admin: Any, n: int = 100) -> None:
    admin.sql(
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, qty INT NOT NULL, total DECIMAL(12,2))"
        " ENGINE=InnoDB",
        f"INSERT INTO orders SELECT seq, seq % 7, seq * 1.25 FROM seq_1_to_{n}",
    )


def test_snapshot_reads_every_row_in_bounded_batches_with_a_receipt(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _orders(admin, 1000)
    ext = source.read(make_request("orders", batch_rows=128, options={"control_totals": "total"}))
    msgs = list(ext)
    sizes = [b.num_rows for b in mt.batches(msgs)]
    assert sum(sizes) == 1000 and max(sizes) <= 128
    assert sorted(mt.table_of(msgs).column("id").to_pylist()) == list(range(1, 1001))
    (state,) = mt.states(msgs)
    assert state.final and state.state == {}
    receipt = ext.receipt
    assert receipt.rows == 1000 and receipt.completed
    assert receipt.clock_authority == SERVER_CLOCK
    assert receipt.snapshot_authority == CONSISTENT_SNAPSHOT and receipt.source_token
    assert ext.control_totals is not None
    assert (ext.control_totals.rows, ext.control_totals.sum) == (1000, "625625.00")
    assert ext.finish("success").cleanup_succeeded


def test_a_snapshot_read_does_not_see_changes_committed_while_it_runs(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _orders(admin, 500)
    ext = source.read(make_request("orders", batch_rows=50, options={"control_totals": True}))
    it = iter(ext)
    first = next(it)
    assert isinstance(first, RecordBatchMessage)
    # Committed by another session after the snapshot was taken.
    admin.sql(
        "INSERT INTO orders VALUES (9001, 1, 1.00), (9002, 1, 1.00)",
        "DELETE FROM orders WHERE id > 400",
        "UPDATE orders SET qty = 99",
    )
    rest = list(it)
    table = mt.table_of([first, *rest])
    assert table.num_rows == 500
    assert max(table.column("id").to_pylist()) == 500
    assert 99 not in table.column("qty").to_pylist()
    # The control totals were counted after the last row, in the same snapshot.
    assert ext.control_totals is not None and ext.control_totals.rows == 500
    ext.finish("success")


@pytest.mark.parametrize("use_bulk", [True, False], ids=["bulk", "rows"])
def test_cursor_pages_through_ties_and_resumes_after_the_checkpoint(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any, use_bulk: bool
) -> None:
    admin.sql(
        "CREATE TABLE ev (id INT PRIMARY KEY, v INT NOT NULL, KEY (v))",
        # 10 rows share each cursor value: pages of 7 rows end inside ties.
        "INSERT INTO ev SELECT seq, seq DIV 10 FROM seq_0_to_99",
    )
    spec = CursorSpec("v", trust="test")
    req = make_request("ev", strategy="cursor", cursor=spec, batch_rows=3, options={"page_rows": 7})
    ext = source.read(req)
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = use_bulk
    msgs = list(ext)
    assert ext.path == ("bulk" if use_bulk else "rows")
    ids = mt.table_of(msgs).column("id").to_pylist()
    assert sorted(ids) == list(range(100)) and len(ids) == 100  # no row lost, none twice
    (state,) = mt.states(msgs)
    assert state.state == {"cursor": 9, "trust": "test"} and state.position == "9"
    ext.finish("success")

    admin.sql("INSERT INTO ev VALUES (100, 9), (101, 10), (102, 11)")
    ext = source.read(make_request("ev", strategy="cursor", cursor=spec, state=state.state))
    msgs = list(ext)
    # Without a lookback the late row at v=9 is not read: the documented limit.
    assert sorted(mt.table_of(msgs).column("id").to_pylist()) == [101, 102]
    assert mt.states(msgs)[0].state["cursor"] == 11
    ext.finish("success")

    lookback = CursorSpec("v", lookback=3, trust="test")
    ext = source.read(make_request("ev", strategy="cursor", cursor=lookback, state={"cursor": 11}))
    ids = sorted(mt.table_of(list(ext)).column("id").to_pylist())
    # v in (8, 11]: the window re-read, the key makes the overlap harmless.
    assert ids == [*range(90, 100), 100, 101, 102]
    ext.finish("success")


def test_cursor_upper_bound_is_read_in_the_snapshot(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _orders(admin, 30)
    req = make_request(
        "orders",
        strategy="cursor",
        cursor=CursorSpec("id"),
        batch_rows=5,
        options={"page_rows": 5, "control_totals": True},
    )
    ext = source.read(req)
    it = iter(ext)
    first = next(it)
    admin.sql("INSERT INTO orders VALUES (31, 1, 1.00), (32, 1, 1.00)")  # between pages
    msgs = [first, *it]
    assert sorted(mt.table_of(msgs).column("id").to_pylist()) == list(range(1, 31))
    assert mt.states(msgs)[0].state["cursor"] == 30
    assert ext.control_totals is not None and ext.control_totals.rows == 30
    ext.finish("success")


def test_the_checkpoint_never_moves_backwards(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _orders(admin, 10)
    admin.sql("DELETE FROM orders WHERE id > 5")
    spec = CursorSpec("id", lookback=3)
    ext = source.read(make_request("orders", strategy="cursor", cursor=spec, state={"cursor": 10}))
    msgs = list(ext)
    assert mt.batches(msgs) == []  # (7, 5]: nothing
    ext.finish("success")
    ext = source.read(make_request("orders", strategy="cursor", cursor=spec, state={"cursor": 7}))
    msgs = list(ext)
    assert mt.table_of(msgs).column("id").to_pylist() == [5]
    assert mt.states(msgs)[0].state["cursor"] == 7  # the max (5) is below the checkpoint
    ext.finish("success")


def test_a_datetime_cursor_takes_a_timedelta_lookback(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    admin.sql(
        "CREATE TABLE upd (id INT PRIMARY KEY, at DATETIME(6) NOT NULL)",
        "INSERT INTO upd VALUES (1, '2026-01-01 10:00:00'), (2, '2026-01-01 10:04:00.5'),"
        " (3, '2026-01-01 10:10:00')",
    )
    spec = CursorSpec("at", lookback=timedelta(minutes=6))
    ext = source.read(make_request("upd", strategy="cursor", cursor=spec))
    msgs = list(ext)
    state = mt.states(msgs)[0].state
    assert state["cursor"] == "2026-01-01T10:10:00"
    ext.finish("success")
    ext = source.read(make_request("upd", strategy="cursor", cursor=spec, state=state))
    table = mt.table_of(list(ext))
    assert sorted(table.column("id").to_pylist()) == [2, 3]
    assert table.column("at").to_pylist()[0] in (
        datetime(2026, 1, 1, 10, 4, 0, 500000),
        datetime(2026, 1, 1, 10, 10),
    )
    ext.finish("success")


def test_a_read_is_lazy_single_use_and_refuses_what_it_cannot_read(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _orders(admin, 3)
    ext = source.read(make_request("orders"))
    assert ext.receipt.extraction_started_at is None  # nothing read until iterated
    list(ext)
    with pytest.raises(ProtocolViolation):
        list(ext)
    ext.finish("success")
    with pytest.raises(ConfigError, match="cdc dataset orders needs a key"):
        source.read(make_request("orders", strategy="cdc", key=()))
    with pytest.raises(ConfigError, match="strategy 'nope'"):
        source.read(make_request("orders", strategy="nope"))
    with pytest.raises(ConfigError, match="declares none"):
        source.read(make_request("orders", strategy="cursor"))
    with pytest.raises(NotFoundError, match="'nope'"):
        list(source.read(make_request("orders", columns=("id", "nope"))))
    with pytest.raises(ConfigError, match="cannot serve as a cursor"):
        admin.sql("CREATE TABLE s (id INT PRIMARY KEY, name VARCHAR(5))")
        list(source.read(make_request("s", strategy="cursor", cursor=CursorSpec("name"))))


def test_an_abandoned_read_closes_its_session(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    _orders(admin, 1000)
    ext = source.read(make_request("orders", batch_rows=10))
    assert isinstance(ext, MariaDBExtraction)
    it = iter(ext)
    next(it)
    conn_id = ext.connection_id
    assert admin.rows(f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {conn_id}")[
        0
    ][0]
    receipt = ext.finish("abort")
    assert receipt.cleanup_succeeded and receipt.receipt is not None
    assert not receipt.receipt.completed
    for _ in range(50):
        alive = admin.rows(
            f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {conn_id}"
        )[0][0]
        if not alive:
            break
        import time

        time.sleep(0.05)
    assert not alive


@pytest.mark.parametrize("use_bulk", [True, False], ids=["bulk", "rows"])
def test_a_key_read_as_text_pages_without_losing_rows(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any, use_bulk: bool
) -> None:
    admin.sql(
        "CREATE TABLE k (id INT PRIMARY KEY, v INT NOT NULL)",
        "INSERT INTO k SELECT seq, 1 FROM seq_1_to_20",
    )
    options = {"page_rows": 5, "casts": {"id": "text"}}
    req = make_request("k", strategy="cursor", cursor=CursorSpec("v"), options=options)
    ext = source.read(req)
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = use_bulk
    ids = mt.table_of(list(ext)).column("id").to_pylist()
    assert sorted(ids, key=int) == [str(i) for i in range(1, 21)]
    ext.finish("success")
    # A read that leaves out a column ordering the pages is refused before any row.
    narrow = make_request("k", strategy="cursor", cursor=CursorSpec("v"), columns=("v",))
    it = iter(source.read(narrow))
    with pytest.raises(ConfigError, match="must select column 'id'"):
        next(it)


def test_a_view_claims_a_snapshot_only_over_transactional_tables(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    admin.sql(
        "CREATE TABLE plain (id INT PRIMARY KEY) ENGINE=MyISAM",
        "CREATE TABLE tx (id INT PRIMARY KEY) ENGINE=InnoDB",
        "INSERT INTO plain VALUES (1)",
        "INSERT INTO tx VALUES (1)",
        "CREATE VIEW over_plain AS SELECT p.id FROM plain p",
        "CREATE VIEW over_both AS SELECT tx.id FROM tx JOIN plain USING (id)",
        "CREATE VIEW over_view AS SELECT id FROM over_plain",
        "CREATE VIEW over_tx AS SELECT t.id FROM tx t",
        "CREATE VIEW over_tx_view AS SELECT id FROM over_tx",
        "CREATE VIEW with_cte AS WITH w AS (SELECT id FROM tx) SELECT w.id FROM w",
        "CREATE VIEW hidden_plain AS SELECT t.id FROM (SELECT id FROM tx) t"
        " WHERE EXISTS (SELECT 1 FROM plain q WHERE q.id = t.id)",
    )
    names = ("plain", "over_plain", "over_both", "over_view", "hidden_plain")
    authority = {}
    for name in (*names, "over_tx", "over_tx_view", "with_cte", "tx"):
        ext = source.read(make_request(name))
        assert len(list(ext)) == 2  # one batch and the final state
        authority[name] = ext.receipt.snapshot_authority
        ext.finish("success")
    assert authority == {
        **dict.fromkeys(names),
        **dict.fromkeys(("over_tx", "over_tx_view", "with_cte", "tx"), CONSISTENT_SNAPSHOT),
    }


def _cursor_rows(
    source: MariaDBSource,
    make_request: Any,
    mt: Any,
    table: str,
    columns: list[str],
    *,
    view: bool = False,
    **kw: Any,
) -> list[tuple[Any, ...]]:
    """The rows read by the row path's keyset pages, equal to the bulk path's.

    A ``view`` is read by rows whether the bulk path is allowed or not (a
    deadline or a cancel could not end its bulk statement): read twice so.
    """
    kw.setdefault("options", {"page_rows": 5})
    req = make_request(table, strategy="cursor", cursor=CursorSpec("v"), batch_rows=4, **kw)
    read: list[list[tuple[Any, ...]]] = []
    for use_bulk in (False, True):
        ext = source.read(req)
        assert isinstance(ext, MariaDBExtraction)
        ext.bulk = use_bulk
        messages = []
        try:
            for message in ext:
                messages.append(message)
                assert len(messages) < 1_000, "the read pages forever"
        finally:
            ext.finish("success")
        assert ext.path == ("bulk" if use_bulk and not view else "rows")
        table_ = mt.table_of(messages)
        read.append(
            sorted(zip(*(table_.column(c).to_pylist() for c in columns), strict=True), key=repr)
        )
    assert read[0] == read[1]
    return read[0]


def test_an_enum_key_pages_in_one_order(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # ORDER BY sorts an ENUM by member number, a comparison with text by text:
    # pages mixing the two read rows twice and lost others.
    admin.sql(
        "CREATE TABLE m (k ENUM('sad', 'ok', 'happy') NOT NULL, n INT NOT NULL,"
        " v INT NOT NULL, PRIMARY KEY (k, n))",
        "INSERT INTO m SELECT ELT(1 + seq % 3, 'sad', 'ok', 'happy'), seq, 1 FROM seq_1_to_12",
    )
    rows = _cursor_rows(source, make_request, mt, "m", ["k", "n"], key=("k", "n"))
    expected = [(("sad", "ok", "happy")[g % 3], g) for g in range(1, 13)]
    assert rows == sorted(expected, key=repr)


def test_keys_that_tie_or_hold_nulls_at_page_edges_are_read_once_each(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # No unique index: 'a' and 'A' are equal to the case-insensitive
    # collation, keys repeat and hold NULLs, and every row shares one cursor
    # value, so page edges fall among tied and NULL keys.
    names = ["a", "A", "b", "B", None, "a", "c", None, "C", "a ", "b", "A"] * 2
    admin.sql(
        "CREATE TABLE t (id VARCHAR(8) COLLATE utf8mb4_general_ci, n INT NOT NULL, v INT NOT NULL)",
        "INSERT INTO t VALUES "
        + ", ".join(
            f"({'NULL' if name is None else repr(name)}, {i}, 1)" for i, name in enumerate(names)
        ),
    )
    rows = _cursor_rows(source, make_request, mt, "t", ["id", "n"])
    assert rows == sorted(((name, i) for i, name in enumerate(names)), key=repr)
    # A view has no index to prove its keys unique: it pages the same way.
    admin.sql("CREATE VIEW tv AS SELECT * FROM t")
    assert _cursor_rows(source, make_request, mt, "tv", ["id", "n"], view=True) == rows


@pytest.mark.parametrize("null", ["NOT NULL", "NULL"])
def test_zero_dates_read_as_nulls_at_page_edges_are_read_once_each(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any, null: str
) -> None:
    # A zero date read as NULL made the next page start "after NULL", which
    # the server does not hold: the same page was read forever. And in a
    # WHERE clause `d IS NULL` is true of a zero date in a NOT NULL DATE or
    # DATETIME column: a page's upper edge took every zero date, read again
    # by the next pages.
    zero = ["'0000-00-00'", "'2020-00-01'", "'2020-01-00'", "'2024-01-01'"]
    admin.sql(
        "SET SESSION sql_mode = ''",
        f"CREATE TABLE z (id INT PRIMARY KEY, v DATETIME {null}, d DATE {null})",
        "INSERT INTO z VALUES "
        + ", ".join(f"({i}, {zero[i % 2 * 3]}, {zero[i % 4]})" for i in range(24)),
        "CREATE VIEW zv AS SELECT * FROM z",
    )
    options = {"page_rows": 5, "zero_dates": "null"}
    expected = sorted(
        ((i, None if i % 2 == 0 else datetime(2024, 1, 1)) for i in range(24)), key=repr
    )
    for relation, key in (("z", ("id",)), ("zv", ("d", "id"))):
        rows = _cursor_rows(
            source,
            make_request,
            mt,
            relation,
            ["id", "v"],
            view=relation == "zv",
            key=key,
            options=options,
        )
        assert rows == expected, relation


def test_keys_longer_than_the_servers_sort_prefix_are_read_once_each(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # ORDER BY sorts strings by their first max_sort_length (1024) bytes only,
    # while a comparison reads them whole: pages of a unique key sharing a
    # 1200-byte prefix ended at a row that was not their largest, and the
    # next page read rows again and skipped others (10 rows read as 0, 0, 1, 1, 2).
    admin.sql(
        "CREATE TABLE s (id INT PRIMARY KEY, k VARCHAR(760) NOT NULL UNIQUE,"
        " b VARBINARY(2000) NOT NULL, v INT NOT NULL) CHARSET utf8mb4",
        "INSERT INTO s SELECT seq, CONCAT(REPEAT('é', 600), 9 - seq),"
        " CONCAT(REPEAT('x', 1100), 9 - seq), 1 FROM seq_0_to_9",
    )
    for key in (("k",), ("b", "id")):
        rows = _cursor_rows(source, make_request, mt, "s", ["id"], key=key)
        assert rows == [(i,) for i in range(10)], key


def test_a_fractional_lookback_on_a_large_integer_cursor_keeps_its_window(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # 2**63 - 200 minus 2.0 was computed in floating point: 2**63, above the
    # checkpoint, so this read and every later one read nothing (row 3 lost).
    top = 2**63
    admin.sql(
        "CREATE TABLE big (id INT PRIMARY KEY, v BIGINT NOT NULL)",
        f"INSERT INTO big VALUES (1, {top - 300}), (2, {top - 200}), (3, {top - 100})",
    )
    spec = CursorSpec("v", lookback=2.0)
    ext = source.read(
        make_request("big", strategy="cursor", cursor=spec, state={"cursor": top - 200})
    )
    msgs = list(ext)
    ext.finish("success")
    assert sorted(mt.table_of(msgs).column("id").to_pylist()) == [2, 3]
    assert mt.states(msgs)[0].state["cursor"] == top - 100


def _gaps(admin: Any) -> None:
    # Every fifth row has a NULL cursor, every fifth from 3 a zero date: a
    # value to the server, the lowest, which zero_dates: null reads as NULL.
    admin.sql(
        "SET SESSION sql_mode = ''",
        "CREATE TABLE g (id INT PRIMARY KEY, v DATETIME NULL, n INT NOT NULL)",
        "INSERT INTO g SELECT seq, CASE seq % 5 WHEN 0 THEN NULL"
        " WHEN 3 THEN '0000-00-00 00:00:00'"
        " ELSE TIMESTAMP('2024-01-01') + INTERVAL seq DIV 4 MINUTE END, seq FROM seq_1_to_40",
    )


def _null_policy_read(
    source: MariaDBSource, make_request: Any, mt: Any, nulls: Any, state: Any = None
) -> tuple[list[int], Any, Any]:
    req = make_request(
        "g",
        strategy="cursor",
        cursor=CursorSpec("v", nulls=nulls),
        state=state,
        batch_rows=4,
        options={"page_rows": 7, "zero_dates": "null", "control_totals": "n"},
    )
    read = []
    for use_bulk in (False, True):  # the row path's pages, then the bulk path: the same
        ext = source.read(req)
        assert isinstance(ext, MariaDBExtraction)
        ext.bulk = use_bulk
        try:
            msgs = list(ext)
        finally:
            ext.finish("success")
        ids = sorted(mt.table_of(msgs).column("id").to_pylist())
        read.append((ids, mt.states(msgs)[0].state, ext.control_totals))
    assert read[0] == read[1]
    return ids, mt.states(msgs)[0], ext


def test_a_null_cursor_fails_the_read_and_a_zero_date_is_not_one(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _gaps(admin)
    with pytest.raises(SchemaMismatch, match="8 rows of 'g' hold null in cursor column 'v'"):
        _null_policy_read(source, make_request, mt, "fail")
    admin.sql("DELETE FROM g WHERE v IS NULL")
    ids, _, _ = _null_policy_read(source, make_request, mt, "fail")
    assert ids == [i for i in range(1, 41) if i % 5]


def test_null_cursor_rows_included_are_read_and_counted_every_read(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _gaps(admin)
    ids, final, ext = _null_policy_read(source, make_request, mt, "include")
    assert ids == list(range(1, 41))
    assert ext.control_totals == ControlTotals(40, "n", str(sum(range(1, 41))))
    assert final.state["cursor"] == "2024-01-01T00:09:00"
    ids, again, ext = _null_policy_read(source, make_request, mt, "include", final.state)
    assert ids == list(range(5, 41, 5))  # the window is empty; zero dates lie below it
    assert again.state == final.state
    assert ext.control_totals == ControlTotals(40, "n", str(sum(range(1, 41))))


def test_null_cursor_rows_excluded_are_neither_read_nor_counted(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    _gaps(admin)
    ids, _, ext = _null_policy_read(source, make_request, mt, "exclude")
    assert ids == [i for i in range(1, 41) if i % 5]
    kept = [i for i in range(1, 41) if i % 5]
    assert ext.control_totals == ControlTotals(32, "n", str(sum(kept)))


def test_rows_of_long_values_are_batched_by_their_bytes_on_the_row_path(
    admin: Any, source: MariaDBSource, make_request: Any, mt: Any
) -> None:
    # 40 rows of 256 KiB: the first chunk (1,000 rows by count) held all
    # 10 MiB at once, and a table of 16 MB values would be read whole.
    admin.sql(
        "CREATE TABLE blobs (id INT PRIMARY KEY, b LONGBLOB, note VARCHAR(10))",
        "INSERT INTO blobs SELECT seq, REPEAT(CHAR(65 + seq % 26), 262144), 'n' FROM seq_1_to_40",
    )
    ext = source.read(make_request("blobs", options={"batch_bytes": 1 << 20}))
    assert isinstance(ext, MariaDBExtraction)
    ext.bulk = False
    msgs = list(ext)
    assert ext.path == "rows"
    sizes = [b.nbytes for b in mt.batches(msgs)]
    assert max(sizes) <= (1 << 20) + 262144 + 4096, sizes
    table = mt.table_of(msgs).sort_by("id")
    assert table.column("id").to_pylist() == list(range(1, 41))
    assert [len(v) for v in table.column("b").to_pylist()] == [262144] * 40
    assert table.column("b")[6].as_py()[:3] == b"HHH"
    ext.finish("success")
