"""Snapshot reads of the SQLite connector: batches, types, receipts, outcomes."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from combined.connectors.abc import CursorSpec, Extraction, ReadRequest
from combined.connectors.sqlite import SQLiteSource
from combined.errors import ConfigError, NotFoundError, ProtocolViolation, SchemaMismatch
from combined.protocol import RecordBatchMessage, StateMessage

ROWS = 250_000


def build(path: Path, script: str, *rows_sql: str) -> Path:
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(script)
        for sql in rows_sql:
            conn.execute(sql)
        conn.commit()
    return path


def series(n: int, select: str, table: str) -> str:
    """Insert ``n`` rows computed from ``i`` = 1..n without Python rows."""
    return (
        f"INSERT INTO {table} WITH RECURSIVE s(i) AS "
        f"(SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) SELECT {select} FROM s"
    )


def snapshot(dataset: str, **kw: Any) -> ReadRequest:
    kw.setdefault("key", ("id",))
    return ReadRequest(
        dataset=dataset, relation=kw.pop("relation", dataset), strategy="snapshot", **kw
    )


def drain(extraction: Extraction) -> tuple[list[Any], list[StateMessage]]:
    batches: list[Any] = []
    states: list[StateMessage] = []
    for message in extraction:
        if isinstance(message, RecordBatchMessage):
            batches.append(message.batch)
        else:
            states.append(message)
    return batches, states


@pytest.fixture
def big(tmp_path: Path) -> SQLiteSource:
    path = build(
        tmp_path / "big.db",
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL, note TEXT)",
        series(ROWS, "i, 'item ' || i, i * 0.5, CASE WHEN i > 200000 THEN 'late' END", "items"),
    )
    return SQLiteSource({"path": str(path)})


def test_snapshot_streams_bounded_batches_under_an_honest_receipt(big: SQLiteSource) -> None:
    extraction = big.read(snapshot("items", batch_rows=10_000))
    try:
        assert not extraction.receipt.acquired  # read() alone reads nothing
        messages: Iterator[Any] = iter(extraction)
        assert not extraction.receipt.acquired  # nor does asking for an iterator
        first = next(messages)
        assert isinstance(first, RecordBatchMessage)
        receipt = extraction.receipt
        assert receipt.extraction_started_at is not None
        assert receipt.extraction_completed_at is None
        assert receipt.rows == first.batch.num_rows

        batches = [first.batch]
        final = None
        for message in messages:
            if isinstance(message, RecordBatchMessage):
                assert extraction.receipt.extraction_completed_at is None
                batches.append(message.batch)
            else:
                final = message
        assert final == StateMessage("items", {}, final=True)
        # complete() happened before the final state was handed over
        done = extraction.receipt
        assert done.extraction_completed_at is not None
        assert done.extraction_started_at == receipt.extraction_started_at
        assert done.extraction_completed_at >= done.extraction_started_at
    finally:
        terminal = extraction.finish("success")

    assert max(b.num_rows for b in batches) == 10_000
    assert len(batches) == ROWS // 10_000
    table = pa.Table.from_batches(batches)
    assert table.num_rows == ROWS == done.rows
    assert done.bytes == sum(b.nbytes for b in batches) > 0
    assert pc.count_distinct(table["id"]).as_py() == ROWS
    assert pc.sum(table["id"]).as_py() == ROWS * (ROWS + 1) // 2
    # The note column is NULL for the first 200k rows: far more than one
    # inference batch, yet it stays a string column with its NULLs.
    assert table.schema.field("note").type == pa.string()
    assert table["note"].null_count == 200_000
    assert pc.count(table["note"]).as_py() == 50_000
    assert terminal.receipt == done


def test_source_batch_rows_caps_the_request(big: SQLiteSource, tmp_path: Path) -> None:
    capped = SQLiteSource({"path": big.path, "batch_rows": 777})
    extraction = capped.read(snapshot("items", batch_rows=100_000, columns=("id",)))
    try:
        batches, _ = drain(extraction)
    finally:
        extraction.finish("success")
    assert max(b.num_rows for b in batches) == 777
    assert sum(b.num_rows for b in batches) == ROWS
    assert batches[0].schema.names == ["id"]


@pytest.fixture
def typed(tmp_path: Path) -> SQLiteSource:
    path = build(
        tmp_path / "typed.db",
        """
        CREATE TABLE t (
            id INTEGER PRIMARY KEY, n INT, r REAL, s VARCHAR(20), b BLOB,
            flag BOOLEAN, amount NUMERIC, at DATETIME, anything
        );
        INSERT INTO t VALUES (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        INSERT INTO t VALUES (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        INSERT INTO t VALUES
            (3, 7, 2, 'two', x'0001', 1, 12345678901234567, '2024-05-01 10:00:00', 5);
        INSERT INTO t VALUES (4, -1, 2.5, 'four', 'text', 0, 19.99, 1714557600, 'x');
        """,
    )
    return SQLiteSource({"path": str(path)})


def test_types_come_from_declarations_not_from_the_first_batch(typed: SQLiteSource) -> None:
    # batch_rows=2: the first batch is all NULL, which would make the driver
    # guess int64 for every column and fail on the third row.
    extraction = typed.read(snapshot("t", batch_rows=2))
    try:
        batches, _ = drain(extraction)
    finally:
        extraction.finish("success")
    assert [b.num_rows for b in batches] == [2, 2]
    assert all(b.schema == batches[0].schema for b in batches)
    table = pa.Table.from_batches(batches)
    assert {f.name: str(f.type) for f in table.schema} == {
        "id": "int64",
        "n": "int64",
        "r": "double",
        "s": "string",
        "b": "binary",
        "flag": "bool",
        "amount": "string",
        "at": "string",
        "anything": "string",
    }
    rows = table.to_pylist()
    assert rows[0] == {k: (1 if k == "id" else None) for k in table.column_names}
    assert rows[2] == {
        "id": 3,
        "n": 7,
        "r": 2.0,
        "s": "two",
        "b": b"\x00\x01",
        "flag": True,
        "amount": "12345678901234567",  # beyond 2**53: exact as text
        "at": "2024-05-01 10:00:00",
        "anything": "5",
    }
    assert rows[3]["b"] == b"text"
    assert rows[3]["amount"] == "19.99"
    assert rows[3]["at"] == "1714557600"  # epoch seconds kept, as text
    assert rows[3]["flag"] is False


@pytest.mark.parametrize(
    ("insert", "column", "declared", "found"),
    [
        ("INSERT INTO t (id, n) VALUES (3000, 'oops')", "n", "INT", "a text value"),
        ("INSERT INTO t (id, n) VALUES (3000, 2.5)", "n", "INT", "a real"),
        ("INSERT INTO t (id, r) VALUES (3000, 'abc')", "r", "REAL", "a text value"),
        ("INSERT INTO t (id, s) VALUES (3000, x'00')", "s", "VARCHAR(20)", "a blob"),
        (
            "INSERT INTO t (id, flag) VALUES (3000, 2)",
            "flag",
            "BOOLEAN",
            "an integer other than 0 or 1",
        ),
        ("INSERT INTO t (id, amount) VALUES (3000, 'n/a')", "amount", "NUMERIC", "a text value"),
    ],
)
def test_a_value_that_does_not_fit_raises_schema_mismatch(
    tmp_path: Path, insert: str, column: str, declared: str, found: str
) -> None:
    path = build(
        tmp_path / "bad.db",
        f"""
        CREATE TABLE t (id INTEGER PRIMARY KEY, n INT, r REAL, s VARCHAR(20),
                        flag BOOLEAN, amount NUMERIC);
        {insert};
        """,
        series(2500, "i, i, i, 's', 1, i", "t"),
    )
    source = SQLiteSource({"path": str(path)})
    # The misfit sits in the third batch, after two clean ones were yielded.
    extraction = source.read(snapshot("orders", relation="t", batch_rows=1000))
    yielded = 0
    try:
        with pytest.raises(SchemaMismatch) as caught:
            for message in extraction:
                if isinstance(message, RecordBatchMessage):
                    yielded += 1
        assert extraction.receipt.extraction_completed_at is None
    finally:
        extraction.finish("abort")
    assert yielded == 2
    error = caught.value
    assert error.context == {
        "dataset": "orders",
        "column": column,
        "declared": declared,
        "found": found,
    }
    assert error.message == (
        f"column {column!r} of dataset 'orders' is declared {declared} but holds {found}"
    )
    assert error.hint
    assert error.run_state == "needs_review"


def test_invalid_utf8_text_is_a_mismatch(tmp_path: Path) -> None:
    path = build(
        tmp_path / "utf8.db",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, s TEXT); "
        "INSERT INTO t VALUES (1, CAST(x'ff00fe' AS TEXT));",
    )
    extraction = SQLiteSource({"path": str(path)}).read(snapshot("t"))
    try:
        with pytest.raises(SchemaMismatch, match="not valid utf-8"):
            drain(extraction)
    finally:
        extraction.finish("abort")


def test_missing_relation_is_not_found(big: SQLiteSource) -> None:
    with pytest.raises(NotFoundError) as caught:
        big.read(snapshot("ghost"))
    assert "'ghost'" in caught.value.message
    assert caught.value.context["relation"] == "ghost"
    # The hint names the command that lists what there is ("run discovery" did not).
    assert "`combined discover SOURCE`" in (caught.value.hint or "")


def test_missing_column_is_not_found(big: SQLiteSource) -> None:
    with pytest.raises(NotFoundError, match="'colour'") as caught:
        big.read(snapshot("items", columns=("id", "colour")))
    assert "`combined discover SOURCE`" in (caught.value.hint or "")
    with pytest.raises(NotFoundError, match="'sku'"):
        big.read(snapshot("items", key=("sku",)))


def test_unsupported_requests_are_refused(big: SQLiteSource) -> None:
    with pytest.raises(ConfigError, match="cdc"):
        big.read(ReadRequest(dataset="items", relation="items", key=("id",), strategy="cdc"))
    with pytest.raises(ConfigError, match="without a cursor"):
        big.read(ReadRequest(dataset="items", relation="items", key=("id",), strategy="cursor"))
    with pytest.raises(ConfigError, match="partitions"):
        big.read(snapshot("items", bounds={"id": (1, 10)}))


def test_blob_cursor_is_refused(tmp_path: Path) -> None:
    path = build(tmp_path / "blob.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB)")
    extraction = SQLiteSource({"path": str(path)}).read(
        ReadRequest(
            dataset="t", relation="t", key=("id",), strategy="cursor", cursor=CursorSpec("b")
        )
    )
    try:
        with pytest.raises(ConfigError, match="'b' is declared BLOB and cannot serve as a cursor"):
            drain(extraction)
    finally:
        extraction.finish("abort")


def test_quoted_identifiers_are_read_safely(tmp_path: Path) -> None:
    path = build(
        tmp_path / "odd.db",
        'CREATE TABLE "we""ird; tab" ("select" TEXT, "a""b" INT); '
        """INSERT INTO "we""ird; tab" VALUES ('x', 1);""",
    )
    extraction = SQLiteSource({"path": str(path)}).read(
        snapshot("odd", relation='we"ird; tab', key=("select",))
    )
    try:
        batches, _ = drain(extraction)
    finally:
        extraction.finish("success")
    assert pa.Table.from_batches(batches).to_pylist() == [{"select": "x", 'a"b': 1}]


def test_the_read_is_one_consistent_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with closing(sqlite3.connect(path)) as writer:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        writer.execute(series(5000, "i", "t"))
        writer.commit()
        extraction = SQLiteSource({"path": str(path)}).read(snapshot("t", batch_rows=1000))
        try:
            messages = iter(extraction)
            first = next(messages)
            assert isinstance(first, RecordBatchMessage)
            seen = first.batch.num_rows
            # Another connection changes the table while the read is open.
            writer.execute("DELETE FROM t WHERE id <= 4000")
            writer.execute("INSERT INTO t (id) VALUES (99999)")
            writer.commit()
            for message in messages:
                if isinstance(message, RecordBatchMessage):
                    seen += message.batch.num_rows
                    assert pc.max(message.batch["id"]).as_py() <= 5000
        finally:
            extraction.finish("success")
    assert seen == 5000


def test_the_source_file_is_never_written(big: SQLiteSource) -> None:
    before = hashlib.sha256(Path(big.path).read_bytes()).hexdigest()
    extraction = big.read(snapshot("items", batch_rows=50_000))
    try:
        drain(extraction)
    finally:
        extraction.finish("success")
    big.discover()
    assert hashlib.sha256(Path(big.path).read_bytes()).hexdigest() == before


def test_first_terminal_outcome_wins(big: SQLiteSource) -> None:
    extraction = big.read(snapshot("items", batch_rows=1000))
    messages = iter(extraction)
    next(messages)
    first = extraction.finish("abort")
    again = extraction.finish("success")
    assert again is first
    assert first.outcome == "abort"
    assert first.cleanup_succeeded
    assert first.receipt is not None and first.receipt.extraction_completed_at is None
    # The connection is gone: the suspended read cannot go on.
    with pytest.raises(ProtocolViolation, match="finished"):
        next(messages)


def test_reading_after_finish_is_an_error(big: SQLiteSource) -> None:
    extraction = big.read(snapshot("items"))
    extraction.finish("abort")
    with pytest.raises(ProtocolViolation, match="finished"):
        next(iter(extraction))
    assert not extraction.receipt.acquired


def test_an_extraction_is_read_once(typed: SQLiteSource) -> None:
    extraction = typed.read(snapshot("t"))
    try:
        drain(extraction)
        with pytest.raises(ProtocolViolation, match="already read"):
            drain(extraction)
    finally:
        extraction.finish("success")


def test_stopping_early_then_aborting_releases_everything(big: SQLiteSource) -> None:
    # filterwarnings=error turns a leaked ADBC connection or cursor into a failure.
    extraction = big.read(snapshot("items", batch_rows=1000))
    for message in extraction:
        assert isinstance(message, RecordBatchMessage)
        break
    terminal = extraction.finish("retain_commit_unknown")
    assert terminal.retained_paths == ()
    assert terminal.cleanup_succeeded


def test_a_misfit_in_the_first_batch_is_not_widened(tmp_path: Path) -> None:
    # Left to itself the driver would turn this whole batch into strings.
    path = build(
        tmp_path / "mixed.db",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, n INT); "
        "INSERT INTO t VALUES (1, 10), (2, 'twenty'), (3, 30);",
    )
    extraction = SQLiteSource({"path": str(path)}).read(snapshot("t"))
    try:
        with pytest.raises(SchemaMismatch, match="'n' of dataset 't' is declared INT"):
            drain(extraction)
        assert extraction.receipt.rows == 0
    finally:
        extraction.finish("abort")


def test_views_are_read_like_tables(tmp_path: Path) -> None:
    path = build(
        tmp_path / "view.db",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, price REAL); "
        "INSERT INTO t VALUES (1, 2.5), (2, 4.0); "
        "CREATE VIEW priced AS SELECT id, price * 2 AS doubled, CAST(price AS INTEGER) AS whole "
        "FROM t;",
    )
    extraction = SQLiteSource({"path": str(path)}).read(snapshot("priced"))
    try:
        batches, _ = drain(extraction)
    finally:
        extraction.finish("success")
    table = pa.Table.from_batches(batches)
    assert {f.name: str(f.type) for f in table.schema} == {
        "id": "int64",
        "doubled": "string",  # an expression without a declared type
        "whole": "int64",
    }
    assert table.to_pylist() == [
        {"id": 1, "doubled": "5.0", "whole": 2},
        {"id": 2, "doubled": "8.0", "whole": 4},
    ]
