"""The lake's values of filled changes, read by Arrow: the rows DuckDB's join of them would give."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.capture import _lake_fills
from combined.capture._lake_fills import lake_numbers_rows, write_lake_values
from combined.capture._unchanged import _largest_value


def _id(n: int) -> bytes:
    return n.to_bytes(16, "big")


def _lake(tmp_path: Path) -> list[str]:
    """Two lake files: ids 1-60 with a list and an int (small row groups), 61-80 without it."""
    first = pa.table(
        {
            "_combined_id": pa.array([_id(i) for i in range(1, 61)], pa.binary()),
            "tags": pa.array(
                [None if i % 9 == 0 else [f"t{i}", None, "x" * i] for i in range(1, 61)],
                pa.list_(pa.string_view()),  # (as delta-rs writes strings)
            ),
            "n": pa.array(range(1, 61), pa.int32()),
        }
    )
    second = pa.table(
        {
            "_combined_id": pa.array([_id(i) for i in range(61, 81)], pa.binary()),
            "n": pa.array(range(61, 81), pa.int64()),
        }
    )
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(first, files[0], row_group_size=7)
    pq.write_table(second, files[1])
    return [str(f) for f in files]


def _picks(con: duckdb.DuckDBPyConnection) -> None:
    """Changes filled from the lake (some ids twice, one the lake lacks) and others that are not."""
    rows = [
        (10, 3, -1, None),
        (11, 3, -1, None),  # a second change of the same lineage, before any carrier
        (12, 40, -1, None),
        (13, 9, -1, None),  # a null list
        (14, 70, -1, None),  # a file without the list
        (15, 999, -1, None),  # an id the lake does not hold
        (16, 5, -1, 2),  # a carrier in the capture: not the lake's
        (17, 6, 0, None),  # a lineage that starts in the capture
        (18, 60, -1, None),
    ]
    con.execute("CREATE TABLE unc_pick (ord BIGINT, _lin BLOB, _lin_ord BIGINT, pord BIGINT)")
    con.executemany(
        "INSERT INTO unc_pick VALUES (?, ?, ?, ?)", [(o, _id(i), lo, p) for o, i, lo, p in rows]
    )


def test_the_lakes_values_are_the_rows_duckdbs_join_gives(tmp_path: Path) -> None:
    files = _lake(tmp_path)
    con = duckdb.connect()
    _picks(con)
    out = tmp_path / "values.parquet"
    read = write_lake_values(con, files, ["tags", "n", "gone"], out)
    assert read == [pa.list_(pa.string()), pa.int64(), pa.null()]
    listing = ", ".join(f"'{f}'" for f in files)
    joined = con.execute(
        "SELECT p.ord, l.tags, l.n, NULL AS gone FROM (SELECT _combined_id, tags, n FROM "
        f"read_parquet([{listing}], union_by_name = true)) l RIGHT JOIN (SELECT ord, _lin FROM "
        "unc_pick WHERE pord IS NULL AND _lin_ord < 0) p ON l._combined_id = p._lin ORDER BY 1"
    ).fetchall()
    written = con.execute(
        f"SELECT ord, v0, v1, v2 FROM read_parquet('{out}') ORDER BY 1"
    ).fetchall()
    assert written == joined
    assert [r[0] for r in written] == [10, 11, 12, 13, 14, 15, 18]
    assert written[0] == (10, ["t3", None, "xxx"], 3, None)
    assert written[3] == (13, None, 9, None) and written[4] == (14, None, 70, None)
    assert written[5] == (15, None, None, None)
    assert pq.read_schema(out).field("v0").type == pa.list_(pa.string())


def test_the_values_file_holds_few_rows_a_row_group_where_they_are_many_elements(
    tmp_path: Path,
) -> None:
    ids = [_id(i) for i in range(400)]
    lake = pa.table(
        {"_combined_id": pa.array(ids, pa.binary()), "big": [[str(j) for j in range(5000)]] * 400}
    )
    pq.write_table(lake, tmp_path / "lake.parquet")  # (one row group of them all)
    con = duckdb.connect()
    con.execute("CREATE TABLE unc_pick (ord BIGINT, _lin BLOB, _lin_ord BIGINT, pord BIGINT)")
    con.executemany("INSERT INTO unc_pick VALUES (?, ?, -1, NULL)", list(enumerate(ids)))
    out = tmp_path / "values.parquet"
    write_lake_values(con, [str(tmp_path / "lake.parquet")], ["big"], out)
    meta = pq.ParquetFile(out).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sum(groups) == 400 and max(groups) <= 32
    (elements,) = con.execute(f"SELECT sum(len(v0)) FROM read_parquet('{out}')").fetchall()[0:1]
    assert elements == (2_000_000,)


def test_a_lake_column_named_as_duckdbs_row_number_keeps_the_lake_read_by_duckdb() -> None:
    assert lake_numbers_rows(["id", "tags"])
    assert not lake_numbers_rows(["id", "file_row_number"])
    assert not lake_numbers_rows(["_combined_file"])


def test_a_lake_lists_read_is_bounded_by_its_elements_not_its_encoded_bytes(
    tmp_path: Path,
) -> None:
    # 143 rows of a list of 5,000 short strings: a dictionary-encoded chunk of
    # ~1.2 MB, 11 MB of DuckDB's vectors (16 bytes an element). The bound read
    # no nested column's chunk at all ("a, list, element" is its path).
    lake = pa.table({"a": [[str(j) for j in range(5000)]] * 143, "n": list(range(143))})
    pq.write_table(lake, tmp_path / "lake.parquet")
    con = duckdb.connect()
    con.execute("CREATE TABLE staged AS SELECT NULL::VARCHAR[] AS a, 1 AS n")
    bound = _largest_value(con, ["a"], "staged", [str(tmp_path / "lake.parquet")])
    assert bound >= 16 * 143 * 5000
    assert _largest_value(con, ["n"], "staged", [str(tmp_path / "lake.parquet")]) < 1 << 20


def test_only_the_files_holding_a_wanted_row_are_opened(tmp_path: Path) -> None:
    # Only ids of the second file are wanted: the first (the one holding the
    # list) is never opened, and the list's type is null (read as NULL).
    files = _lake(tmp_path)
    con = duckdb.connect()
    con.execute("CREATE TABLE unc_pick (ord BIGINT, _lin BLOB, _lin_ord BIGINT, pord BIGINT)")
    con.executemany("INSERT INTO unc_pick VALUES (?, ?, -1, NULL)", [(1, _id(65)), (2, _id(5000))])
    opened: list[str] = []

    def opening(file: str) -> str:
        opened.append(file)
        return file

    out = tmp_path / "values.parquet"
    read = write_lake_values(con, files, ["tags", "n"], out, opening)
    assert opened == [files[1]]
    assert read == [pa.null(), pa.int64()]
    assert pq.read_table(out).to_pylist() == [
        {"ord": 1, "v0": None, "v1": 65},
        {"ord": 2, "v0": None, "v1": None},
    ]


def test_files_of_views_and_plain_strings_and_maps_read_as_duckdb_reads_them(
    tmp_path: Path,
) -> None:
    # A delta-rs merge rewrites the files it touches with string views beside
    # the files Arrow wrote with plain strings; Arrow unifies neither pair.
    ids = pa.array([_id(1), _id(2)], pa.binary())
    maps = pa.map_(pa.string(), pa.int64())
    for n, (view, text) in enumerate(((pa.string_view(), "z"), (pa.string(), "y"))):
        pq.write_table(
            pa.table(
                {
                    "_combined_id": ids.slice(n, 1),
                    "l": pa.array([[text]], pa.list_(view)),
                    "m": pa.array([[(text, n)]], maps),
                }
            ),
            tmp_path / f"{n}.parquet",
        )
    files = [str(tmp_path / f"{n}.parquet") for n in range(2)]
    con = duckdb.connect()
    con.execute("CREATE TABLE unc_pick (ord BIGINT, _lin BLOB, _lin_ord BIGINT, pord BIGINT)")
    con.executemany("INSERT INTO unc_pick VALUES (?, ?, -1, NULL)", [(1, _id(1)), (2, _id(2))])
    out = tmp_path / "values.parquet"
    assert write_lake_values(con, files, ["l", "m"], out) == [pa.list_(pa.string()), maps]
    assert con.execute(f"SELECT ord, v0, v1 FROM read_parquet('{out}') ORDER BY 1").fetchall() == [
        (1, ["z"], {"z": 0}),
        (2, ["y"], {"y": 1}),
    ]


def test_a_value_taken_for_many_changes_is_written_a_few_mb_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many updates in a row leaving one 1 MB text alone take the same lake
    # row, copied for each: taken at once, 2,100 copies would pass a string
    # array's 2 GiB. They are taken about READ_BYTES (8 MB) at a time.
    big = "v" * (1 << 20)
    lake = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"_combined_id": pa.array([_id(1), _id(2)]), "body": [big, "small"]}), lake
    )
    con = duckdb.connect()
    con.execute("CREATE TABLE unc_pick (ord BIGINT, _lin BLOB, _lin_ord BIGINT, pord BIGINT)")
    rows = [(o, _id(1), -1, None) for o in range(40)] + [(40, _id(2), -1, None)]
    con.executemany("INSERT INTO unc_pick VALUES (?, ?, ?, ?)", rows)
    taken: list[int] = []
    write = _lake_fills._write

    def counted(writer: pq.ParquetWriter, batch: pa.RecordBatch) -> int:
        taken.append(batch.num_rows)
        return write(writer, batch)

    monkeypatch.setattr(_lake_fills, "_write", counted)
    out = tmp_path / "fills.parquet"
    write_lake_values(con, [str(lake)], ["body"], out)
    got = pq.read_table(out).to_pydict()
    assert sorted(zip(got["ord"], got["v0"], strict=True)) == [
        *((o, big) for o in range(40)),
        (40, "small"),
    ]
    assert sum(taken) == 41 and max(taken) <= 9, taken  # (8 MB of 1 MB values, one more at most)


def test_staged_carriers_are_read_as_the_staged_schema_holds_them(tmp_path: Path) -> None:
    # The carriers' values read from the staged parts: a part staged before
    # a column appeared holds it as null (as DuckDB's scan of the staged
    # parts reads it), a view is written as its plain type, and a carrier
    # several changes share is written for each of them.
    from combined.capture._lake_fills import write_staged_values

    old = pa.record_batch({"_combined_ordinal": pa.array([0, 1], pa.int64())})
    new = pa.record_batch(
        {
            "_combined_ordinal": pa.array([3, 2], pa.int64()),
            "body": pa.array(["three", "two"], pa.string_view()),
        }
    )
    files = []
    for name, batch in (("p0.arrow", old), ("p1.arrow", new)):
        files.append(tmp_path / name)
        with pa.OSFile(str(files[-1]), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
            w.write_batch(batch)
    con = duckdb.connect()
    con.execute("CREATE TABLE unc_pick (ord BIGINT, pord BIGINT)")
    picks = [(10, 1), (11, 3), (12, 3), (13, 2), (14, None)]
    con.executemany("INSERT INTO unc_pick VALUES (?, ?)", picks)
    staged = pa.schema([("_combined_ordinal", pa.int64()), ("body", pa.string_view())])
    out = tmp_path / "carried.parquet"
    write_staged_values(con, files, staged, ["body"], out)
    got = pq.read_table(out)
    assert got.schema.field("v0").type == pa.large_string()
    assert sorted(zip(*got.to_pydict().values(), strict=True)) == [
        (10, None),
        (11, "three"),
        (12, "three"),
        (13, "two"),
    ]


def test_the_values_files_are_written_plain_with_statistics_only_on_the_ordinals(
    tmp_path: Path,
) -> None:
    # (a file read back once: a dictionary of 51M distinct integers cost its writer 4x)
    files = _lake(tmp_path)
    con = duckdb.connect()
    _picks(con)
    out = tmp_path / "values.parquet"
    write_lake_values(con, files, ["tags", "n"], out)
    meta = pq.ParquetFile(out).metadata
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            column = meta.row_group(g).column(c)
            assert "PLAIN_DICTIONARY" not in column.encodings
            assert "RLE_DICTIONARY" not in column.encodings
            assert column.is_stats_set == (column.path_in_schema == "ord")
