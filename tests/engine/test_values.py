"""A snapshot re-capture compared with the lake by value: only the rows that differ are hashed.

Staging leaves the rows unhashed where the previous capture staged the same
columns in the same types (``capture._values``); the reduction hashes both
sides' values with DuckDB, md5-hashes only the rows whose values differ, and
the lake must hold exactly what hashing every row would have given it: the
same rows, ids and payload hashes as a fresh capture of the source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import deltalake
import psycopg
import pyarrow as pa
import pytest
from tests.conftest import ON_EVERY_STORE

from combined.capture._values import comparable, lake_form
from combined.engine import Engine
from combined.runtime import _extract


@pytest.fixture(autouse=True)
def _small_tables_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables here are small: compared by value all the same."""
    monkeypatch.setattr(_extract, "VALUES_MIN_ROWS", 0)


PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      {dataset}:
        key: [id]
"""

ROWS = """
CREATE TABLE items (
  id bigint PRIMARY KEY, qty int, name text, price numeric(12, 2), big numeric(38, 4),
  seen_at timestamptz, doc jsonb, tags text[], raw bytea, ref uuid, day date, ok boolean,
  ratio float8
);
INSERT INTO items
SELECT i, i % 7, 'item ' || i, i * 1.25, i * 1000000.0001,
       timestamptz '2026-01-01' + i * interval '1 minute', jsonb_build_object('i', i),
       ARRAY['t' || i, NULL], decode(md5(i::text), 'hex'), md5(i::text)::uuid,
       date '2026-01-01' + i, i % 2 = 0, i / 3.0
FROM generate_series(1, 3000) AS i;
"""
COLUMNS = "id, qty, name, price, big, seen_at, doc, tags, raw, ref, day, ok, ratio"
SMALL = (
    "CREATE TABLE items (id bigint PRIMARY KEY, qty int)",
    "INSERT INTO items SELECT i, i FROM generate_series(1, 500) i",
)


def _write(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
    time.sleep(1.0)  # (the statistics count a session's writes as it exits)


def _engine(root: Path, dsn: str, dataset: str = "items") -> Engine:
    root.mkdir(parents=True, exist_ok=True)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, dataset=dataset))
    return Engine.open(root / "combined.yaml")


def _capture(engine: Engine, dataset: str = "items") -> dict[str, Any]:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats: dict[str, Any] = run.stats[dataset]
    return stats


def _rows(engine: Engine, dataset: str = "items") -> list[tuple[Any, ...]]:
    """The lake's rows with their ids and payload hashes, by id."""
    rows = engine.sql(
        f"SELECT {COLUMNS}, _combined_id, _combined_payload_hash FROM pg.{dataset} ORDER BY id"
    ).to_pylist()
    return [tuple(r.values()) for r in rows]


def _fresh(root: Path, dsn: str) -> list[tuple[Any, ...]]:
    """What a first capture of the source now gives: every row hashed."""
    engine = _engine(root, dsn)
    try:
        _capture(engine)
        return _rows(engine)
    finally:
        engine.close()


def test_changed_rows_are_found_by_value_and_the_lake_is_what_hashing_every_row_gives(
    tmp_path: Path, pg_database: str
) -> None:
    _write(pg_database, ROWS)
    engine = _engine(tmp_path / "a", pg_database)
    try:
        first = _capture(engine)
        assert first["inserts"] == 3000 and "compared" not in first
        _write(
            pg_database,
            "UPDATE items SET name = 'renamed' WHERE id = 17",
            "UPDATE items SET tags = ARRAY[NULL, 't18'] WHERE id = 18",
            "UPDATE items SET big = -0.0001, doc = '{\"i\": 0}' WHERE id = 19",
            "UPDATE items SET qty = CASE id WHEN 1 THEN 2 ELSE 1 END WHERE id IN (1, 2)",
            "UPDATE items SET ratio = ratio WHERE id = 20",  # (rewritten, the same value)
            "DELETE FROM items WHERE id IN (30, 31)",
            "INSERT INTO items (id, qty) VALUES (5000, 1), (5001, NULL)",
        )
        changed = _capture(engine)
        assert changed["compared"] == "values"
        counts = (changed["inserts"], changed["updates"], changed["deletes"])
        assert counts == (2, 5, 2)
        assert changed["reconciliation"] == "reconciled"
        assert _rows(engine) == _fresh(tmp_path / "b", pg_database)
        again = _capture(engine)  # (nothing written: the fold confirms it)
        assert again["fold"] == "same" and "compared" not in again
    finally:
        engine.close()


def test_a_key_held_twice_is_refused_as_when_every_row_is_hashed(
    tmp_path: Path, pg_database: str
) -> None:
    """The comparison by value hands over to hashing every row, whose check holds it."""
    _write(
        pg_database,
        "CREATE TABLE items (id bigint, qty int)",  # (no primary key: nothing stops a repeat)
        "INSERT INTO items SELECT i, i FROM generate_series(1, 1000) i",
    )
    engine = _engine(tmp_path, pg_database)
    try:
        _capture(engine)
        for repeat in ("(7, 70)", "(8, 8)"):  # (another payload; then the same row again)
            _write(pg_database, f"INSERT INTO items VALUES {repeat}")
            (run,) = engine.capture()
            assert run.state == "needs_review", run.state
            assert "more than once" in (run.error or "") or "duplicate" in (run.error or "")
            _write(
                pg_database,
                f"DELETE FROM items WHERE (id, qty) = {repeat}",
                "INSERT INTO items SELECT 8, 8 WHERE NOT EXISTS (SELECT FROM items WHERE id = 8)",
            )
        last = _capture(engine)
        assert last["compared"] == "values" and last["updates"] == 0
    finally:
        engine.close()


def test_a_column_staged_in_another_type_is_hashed_once_then_compared_again(
    tmp_path: Path, pg_database: str
) -> None:
    """The canonical text of a value depends on its staged type: the previous capture's
    types must be this one's for equal values to mean equal payload hashes."""
    _write(pg_database, *SMALL)
    engine = _engine(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(
            pg_database,
            "ALTER TABLE items ALTER COLUMN qty TYPE bigint",
            "UPDATE items SET qty = 0 WHERE id = 1",
        )
        widened = _capture(engine)
        assert "compared" not in widened and widened["updates"] == 1
        _write(pg_database, "UPDATE items SET qty = 7 WHERE id = 2")
        again = _capture(engine)
        assert again["compared"] == "values" and again["updates"] == 1
    finally:
        engine.close()


def test_a_source_without_a_marker_is_compared_by_value(tmp_path: Path, pg_database: str) -> None:
    """A view that reads the clock gives no marker: its unchanged rows are still not hashed."""
    _write(
        pg_database,
        "CREATE TABLE goods (id bigint PRIMARY KEY, made date, qty int)",
        "INSERT INTO goods SELECT i, date '2026-01-01' + i, i FROM generate_series(1, 800) i",
        "CREATE VIEW recent AS SELECT id, qty FROM goods WHERE made > CURRENT_DATE - 4000",
    )
    engine = _engine(tmp_path, pg_database, "recent")
    try:
        assert _capture(engine, "recent")["inserts"] == 800
        same = _capture(engine, "recent")
        assert same["compared"] == "values" and "fold" not in same
        assert (same["inserts"], same["updates"], same["deletes"]) == (0, 0, 0)
        _write(pg_database, "UPDATE goods SET qty = -1 WHERE id = 5")
        changed = _capture(engine, "recent")
        assert changed["compared"] == "values" and changed["updates"] == 1
    finally:
        engine.close()


def test_another_writers_commit_sets_the_comparison_by_value_aside(
    tmp_path: Path, pg_database: str
) -> None:
    """It may have changed a stored payload hash without its values: hash every row."""
    _write(pg_database, *SMALL)
    engine = _engine(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(pg_database, "INSERT INTO items VALUES (600, 6)")
        _capture(engine)  # (a second file)
        table = deltalake.DeltaTable(str(tmp_path / "lake" / "pg" / "items"))
        assert table.optimize.compact()["numFilesRemoved"] == 2
        _write(pg_database, "UPDATE items SET qty = 0 WHERE id = 3")
        after = _capture(engine)
        assert "compared" not in after and after["updates"] == 1
        _write(pg_database, "UPDATE items SET qty = 0 WHERE id = 4")
        assert _capture(engine)["compared"] == "values"
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("staged", "stored"),
    [
        (pa.int32(), pa.int32()),
        (pa.large_string(), pa.string()),
        (pa.string_view(), pa.string()),
        (pa.binary(16), pa.binary()),
        (pa.timestamp("ms", tz="Europe/Paris"), pa.timestamp("us", tz="UTC")),
        (pa.timestamp("s"), pa.timestamp("us")),
        (pa.uint32(), pa.int64()),
        (pa.uint64(), pa.decimal128(20, 0)),
        (pa.float16(), pa.float32()),
        (pa.dictionary(pa.int8(), pa.string()), pa.string()),
        (pa.list_(pa.large_string()), pa.list_(pa.string())),
        (pa.decimal128(38, 4), pa.decimal128(38, 4)),
    ],
)
def test_types_the_lake_stores_without_losing_a_value_are_compared(
    staged: pa.DataType, stored: pa.DataType
) -> None:
    assert lake_form(staged) == stored
    lake = pa.schema([("id", pa.int64()), ("v", stored), ("_combined_id", pa.binary())])
    ours = pa.schema([("id", pa.int64()), ("v", staged), ("_combined_ordinal", pa.int64())])
    assert comparable(ours, lake, ["id"]) == pa.schema([("id", pa.int64()), ("v", stored)])


@pytest.mark.parametrize(
    "staged",
    [
        pa.timestamp("ns"),  # (the lake keeps microseconds: two values would meet)
        pa.date64(),
        pa.time64("us"),
        pa.duration("s"),
        pa.decimal256(40, 2),
        pa.struct([("a", pa.int32())]),
        pa.map_(pa.string(), pa.int32()),
        pa.list_(pa.list_(pa.int32())),
        pa.null(),
    ],
)
def test_types_the_lake_stores_with_a_loss_or_whose_hash_loses_structure_are_not(
    staged: pa.DataType,
) -> None:
    assert lake_form(staged) is None
    lake = pa.schema([("id", pa.int64()), ("v", pa.string())])
    assert comparable(pa.schema([("id", pa.int64()), ("v", staged)]), lake, ["id"]) is None


def test_columns_that_differ_by_name_or_type_are_not_compared() -> None:
    lake = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_combined_id", pa.binary())])
    assert comparable(pa.schema([("id", pa.int64()), ("v", pa.int32())]), lake, ["id"]) is None
    assert comparable(pa.schema([("id", pa.int64())]), lake, ["id"]) is None  # (v dropped)
    wider = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("w", pa.int64())])
    assert comparable(wider, lake, ["id"]) is None  # (w added)
    assert comparable(pa.schema(list(lake)[:2]), lake, []) is None  # (no key)
    assert comparable(pa.schema(list(lake)[:2]), None, ["id"]) is None  # (no table)


def test_every_row_changed_is_hashed_group_by_group(tmp_path: Path, pg_database: str) -> None:
    """Candidates past one group of rows (every row here) land as hashing every row would."""
    _write(pg_database, ROWS.replace("3000", "140000"))
    engine = _engine(tmp_path / "a", pg_database)
    try:
        _capture(engine)
        _write(pg_database, "UPDATE items SET qty = qty + 1")
        changed = _capture(engine)
        assert changed["compared"] == "values" and changed["updates"] == 140000
        assert _rows(engine) == _fresh(tmp_path / "b", pg_database)
    finally:
        engine.close()


def test_the_lake_read_again_is_checked_row_by_row_against_the_first_read(
    tmp_path: Path,
) -> None:
    """The second read takes each row's hashes from the first's cache: in its order only."""
    import duckdb
    import numpy as np
    import pyarrow.parquet as pq

    from combined.capture._values import Misaligned, ValuePrints

    lake = tmp_path / "lake.parquet"
    digests = [bytes([i]) * 16 for i in range(3)]
    pq.write_table(
        pa.table(
            {
                "id": [1, 2, 3],
                "v": ["a", "b", "c"],
                "_combined_id": digests,
                "_combined_payload_hash": digests,
            }
        ),
        lake,
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    payload = pa.schema([("id", pa.int64()), ("v", pa.string())])
    prints = ValuePrints(duckdb.connect(), payload, ["id"], [], [str(lake)], cache)
    assert prints.agree()
    first = pa.Table.from_batches(list(prints.current()))
    assert pa.Table.from_batches(list(prints.current())).equals(first)  # (from the cache)
    words = np.fromfile(cache / "lake", np.uint64).reshape(-1, 4)
    words[[0, 1]] = words[[1, 0]]  # (two rows of the cache swapped)
    words.tofile(cache / "lake")
    with pytest.raises(Misaligned):
        list(prints.current())


def test_a_small_table_is_hashed_as_it_is_read(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Comparing costs a few queries a table: below ``VALUES_MIN_ROWS`` rows md5 is cheaper."""
    monkeypatch.setattr(_extract, "VALUES_MIN_ROWS", 501)
    _write(pg_database, *SMALL)
    engine = _engine(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(pg_database, "UPDATE items SET qty = 0 WHERE id = 1")
        small = _capture(engine)
        assert "compared" not in small and small["updates"] == 1
        _write(
            pg_database,
            "INSERT INTO items VALUES (501, 1)",
            "UPDATE items SET qty = 0 WHERE id = 2",
        )
        _capture(engine)  # (501 rows now)
        _write(pg_database, "UPDATE items SET qty = 0 WHERE id = 3")
        assert _capture(engine)["compared"] == "values"
    finally:
        engine.close()


@ON_EVERY_STORE
def test_an_object_store_lake_is_compared_by_value_as_a_local_one(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """The lake's files read through the store, as the reduction's other reads are."""
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}"))
    engine = Engine.open(project)
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        tools.sql(
            tmp_path,
            "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
            "DELETE FROM orders WHERE id > 190; INSERT INTO orders VALUES (500, 1, 'new', 1.0);",
        )
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        assert second.stats is not None
        stats = second.stats["orders"]
        assert stats["compared"] == "values"
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (1, 10, 10)
        assert stats["reconciliation"] == "reconciled"
        shipped = engine.sql("SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'")
        assert shipped.to_pylist() == [{"n": 10}]
    finally:
        engine.close()


def test_the_lake_is_read_on_one_thread_and_the_settings_come_back(tmp_path: Path) -> None:
    """In the files' order on two threads, chunks waited their turn: ~+30 MB at 5M rows."""
    import duckdb
    import pyarrow.parquet as pq

    from combined.capture._values import ValuePrints

    lake = tmp_path / "lake.parquet"
    digests = [bytes([i]) * 16 for i in range(3)]
    columns = {"id": [1, 2, 3], "_combined_id": digests, "_combined_payload_hash": digests}
    pq.write_table(pa.table(columns), lake)
    con = duckdb.connect(config={"threads": 3, "preserve_insertion_order": False})
    settings = "SELECT current_setting('threads'), current_setting('preserve_insertion_order')"
    payload = pa.schema([("id", pa.int64())])
    prints = ValuePrints(con, payload, ["id"], [], [str(lake)], tmp_path)
    read = prints.current()
    next(read)
    assert con.cursor().sql(settings).fetchall()[0][0] == 1  # (threads: the database's)
    list(read)
    assert con.sql(settings).fetchall() == [(3, False)]
