"""A change stream's reduction: marked (TOAST-unchanged) values filled, within its memory."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.runtime.test_reduce_streamed import (
    CONSTANTS,
    new_reducer,
)

from combined.capture._lake_fills import EventLake
from combined.capture._reduce import Reducer, Transition
from combined.delivery import PartWriter, StagingArea
from combined.delivery._staging import Limits
from combined.protocol.identity import identity_python


def _change_stream(
    tmp_path: Path,
    payload: list[tuple[str, pa.DataType]],
    columns: dict[str, list[Any]],
    part_rows: int = 100,
) -> tuple[list[Path], pa.Schema]:
    """A change stream, staged in parts of ``part_rows``: payload, op and unchanged marks."""
    n = len(columns["_combined_op"])
    schema = pa.schema(
        [
            *payload,
            ("_combined_op", pa.string()),
            ("_combined_ordinal", pa.int64()),
            ("_combined_unchanged", pa.list_(pa.string())),
        ]
    )
    data = {**columns, "_combined_ordinal": list(range(n))}
    writer = PartWriter(StagingArea(tmp_path / "cdc", Limits()), "s/d/capture", part_rows, 2**30)
    writer.write(pa.RecordBatch.from_pydict({f.name: data[f.name] for f in schema}, schema=schema))
    return writer.close(), schema


@pytest.mark.parametrize(
    ("marked", "name", "filled"),
    [
        ([None, [], None], "v2", False),  # nothing marked: read as staged
        ([None, ["name"]], "v0", True),  # a marked value comes from the earlier change
    ],
)
def test_a_change_stream_fills_marked_values_and_skips_the_fill_without_any(
    tmp_path: Path, marked: list[list[str] | None], name: str, filled: bool
) -> None:
    # Updates of id 1, each marking the columns it left alone.
    n = len(marked)
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("name", pa.string())],
        {
            "id": [1] * n,
            "name": [None if m else f"v{i}" for i, m in enumerate(marked)],
            "_combined_op": ["insert"] + ["update"] * (n - 1),
            "_combined_unchanged": marked,
        },
    )
    r = new_reducer(tmp_path, parts, schema, strategy="cdc", baseline=False)
    try:
        (view,) = r.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'res'").fetchall()
        t = r.reduce()
        r.release()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000))).to_pylist()
    finally:
        r.close()
    # The staged rows meet the table of fills only when a value is marked.
    assert ("unc_fill" in view[0]) == filled
    assert (t.inserts, t.updates) == (1, 0)
    assert [row["name"] for row in rows] == [name]


def test_a_marked_value_comes_from_the_lake_and_a_new_column_has_no_lake_value(
    tmp_path: Path,
) -> None:
    # The lake holds id 1 without the column "extra" the change stream added;
    # the update left "name" alone (marked): its value is the lake's.
    lake = pa.table(
        {
            "_combined_id": [identity_python([1], [pa.int64()])],
            "_combined_payload_hash": ["h"],
            "id": [1],
            "name": ["kept"],
        }
    )
    current = tmp_path / "current.parquet"
    pq.write_table(lake, current)
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("name", pa.string()), ("extra", pa.int64())],
        {
            "id": [1],
            "name": [None],
            "extra": [42],
            "_combined_op": ["update"],
            "_combined_unchanged": [["name"]],
        },
    )
    r = new_reducer(tmp_path, parts, schema, strategy="cdc", current=[str(current)])
    try:
        rows = r.con.execute("SELECT id, name, extra FROM res").fetchall()
    finally:
        r.close()
    assert rows == [(1, "kept", 42)]


def _stream_reducer(
    tmp_path: Path,
    parts: list[Path],
    schema: pa.Schema,
    memory: int,
    events: Callable[[], EventLake] | None = None,
) -> Reducer:
    """A change stream's reduction keyed by ``id``, with no current rows; ``events``:
    an event stream's (``sync_mode: append``) lake."""
    return Reducer(
        capture_files=parts,
        capture_schema=schema,
        current_files=[],
        key=["id"],
        strategy="cdc",
        sync_mode="incremental" if events is None else "append",
        memory_limit=memory,
        spill_dir=tmp_path,
        baseline=False,
        events=events,
    )


def _drained(
    tmp_path: Path, parts: list[Path], schema: pa.Schema
) -> tuple[Transition, list[dict[str, Any]]]:
    """A change stream keyed by ``id`` reduced at the default memory: its transition and rows."""
    r = _stream_reducer(tmp_path, parts, schema, 256 * 2**20)  # the default reduction_memory
    try:
        t = r.reduce()
        r.release()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000))).to_pylist()
    finally:
        r.close()
    return t, rows


def test_a_change_streams_filled_rows_get_the_reductions_memory_back_when_they_need_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Filled rows are delivered at a lowered memory; on data that needed more
    # the capture failed for memory, and each retry alike (found by
    # tests/engine/test_crash_random.py: wide unchanged values, 4,000 rows).
    from combined.capture import _deliver, _unchanged

    monkeypatch.setattr(_unchanged, "FILLED_OUTPUT_MB", 0)
    monkeypatch.setattr(_deliver, "FILL_JOIN_MB", 0)  # 1 MB in all: too little for these
    n = 3000
    big = "x" * 1000
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("name", pa.string()), ("note", pa.string())],
        {
            "id": [*range(n), *range(n)],
            "name": [f"{big}{i}" for i in range(n)] + [None] * n,
            "note": ["a"] * n + ["b"] * n,
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [["name"]] * n,
        },
    )
    t, rows = _drained(tmp_path, parts, schema)
    assert (t.inserts, t.updates) == (n, 0)
    assert sorted((row["id"], row["name"], row["note"]) for row in rows) == [
        (i, f"{big}{i}", "b") for i in range(n)
    ]


def test_a_change_stream_of_wide_lists_reduces_within_its_memory(tmp_path: Path) -> None:
    # The canonical text of a list holds ~4x a DuckDB vector's bytes in each
    # thread: 4,000 updates of 12 kB string lists in one staged part ran out
    # of the reduction's 64 MB (a quarter of 256) at every retry, the
    # dataset stuck (found by tests/engine/test_crash_random.py, seed 380).
    n = 4000
    tags = [[f"{i}-{j}" + "x" * 3000 for j in range(4)] for i in range(n)]
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("tags", pa.list_(pa.string()))],
        {
            "id": [i % (n // 2) for i in range(n)],
            "tags": tags,
            "_combined_op": ["update"] * n,
            "_combined_unchanged": [None] * n,
        },
        part_rows=n,
    )
    t, rows = _drained(tmp_path, parts, schema)
    assert (t.inserts, t.updates, t.captured) == (n // 2, 0, n)
    assert sorted((row["id"], row["tags"]) for row in rows) == [
        (i, tags[i + n // 2]) for i in range(n // 2)
    ]


def test_filled_lists_that_outgrow_a_change_streams_memory_are_hashed_with_the_whole(
    tmp_path: Path,
) -> None:
    # Hashing a list holds ~8 times its bytes in DuckDB: 1,250 updates that
    # left three 20 kB string lists alone (each filled from the insert
    # before it) ran out of the reduction's share at every retry. A window
    # of filled rows that does is hashed again on one thread, with the whole
    # reduction memory.
    n, cols = 1250, ["a", "b", "c"]
    lists = {c: [[f"{c}{i}-{j}" + "x" * 2500 for j in range(8)] for i in range(n)] for c in cols}
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("n", pa.int64())] + [(c, pa.list_(pa.string())) for c in cols],
        {
            "id": [*range(n), *range(n)],
            "n": [0] * n + [1] * n,
            **{c: lists[c] + [None] * n for c in cols},
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [cols] * n,
        },
        part_rows=2 * n,
    )
    t, rows = _drained(tmp_path, parts, schema)
    assert (t.inserts, t.updates) == (n, 0)
    assert sorted((r["id"], r["n"], r["a"], r["b"], r["c"]) for r in rows) == [
        (i, 1, lists["a"][i], lists["b"][i], lists["c"][i]) for i in range(n)
    ]


def test_a_change_stream_of_lists_of_thousands_of_short_strings_reduces_and_delivers(
    tmp_path: Path,
) -> None:
    # DuckDB holds a 16-byte header for each element beside its bytes: a
    # staged batch of 3,000 updates of 5,000-element lists asked DuckDB for
    # 256 MB at once, hashed or delivered whole, at every retry.
    n, width = 3000, 5000
    import numpy as np
    import pyarrow.compute as pc

    values = pc.cast(pa.array(np.tile(np.arange(width), n)), pa.string())
    tags = pa.ListArray.from_arrays(pa.array(np.arange(n + 1) * width, pa.int32()), values)
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("tags", pa.list_(pa.string()))],
        {
            "id": pa.array([i % (n // 2) for i in range(n)], pa.int64()),
            "tags": tags,
            "_combined_op": ["update"] * n,
            "_combined_unchanged": [None] * n,
        },
        part_rows=n,
    )
    t, rows = _drained(tmp_path, parts, schema)
    assert (t.inserts, t.captured) == (n // 2, n)
    assert sorted(r["id"] for r in rows) == list(range(n // 2))
    assert all(r["tags"] == [str(j) for j in range(width)] for r in rows[:3])


def _events_lake(tmp_path: Path) -> EventLake:
    """An event stream's lake (``sync_mode: append``): each id's events, in two files.

    The newest event of each id holds ``name`` "new"; the others "old".
    """
    t1, t2 = (datetime(2026, 11, 29, 0, 0, s, tzinfo=UTC) for s in (1, 2))
    at = datetime(2026, 11, 28, tzinfo=UTC)
    # (id, name, op, ingested, emitted, position); the older events in the later file
    first = [
        (1, "new", "update", t2, at, "0/5"),  # a later capture's event ...
        (2, "new", "update", t1, at, "0/10000000"),
        (3, "new", "update", t1, at, "0/10"),
        (4, "old", "update", t1, at, "0/20"),  # one transaction's two changes: the later row
        (4, "new", "update", t1, at, "0/20"),
        (5, "gone", "delete", t2, at, "0/50"),
        (6, "new", "update", t1, at, "binlog.000002:1000"),
        (7, None, "update", t2, at, "0/60"),
        (9, "new", "update", t1, at, "0/70"),  # one transaction's two changes, in two
    ]
    second = [
        (1, "old", "update", t1, at, "0/FFFFFFF"),  # ... is newer than an earlier capture's
        (2, "old", "update", t1, at, "0/FFFFFF0"),  # an LSN that is larger as text only
        (3, "old", "snapshot", t1, None, "0/10"),  # a snapshot's row at the stream's start
        (5, "old", "update", t1, at, "0/30"),  # deleted since: no current row
        (6, "old", "update", t1, at, "binlog.000002:999"),
        (7, "kept", "update", t1, at, "0/40"),  # a real null since: kept
        (9, "old", "update", t1, at, "0/70"),  # Deliveries: the later one's (not file b's)
    ]
    files = []
    for name, rows in (("a", first), ("b", second)):
        columns = list(zip(*rows, strict=True))
        table = pa.table(
            {
                "_combined_id": [identity_python([i], [pa.int64()]) for i in columns[0]],
                "id": pa.array(columns[0], pa.int64()),
                "name": pa.array(columns[1], pa.string()),
                "_combined_op": pa.array(columns[2], pa.string()),
                "_combined_ingested_at": pa.array(columns[3], pa.timestamp("us", "UTC")),
                "_combined_emitted_at": pa.array(columns[4], pa.timestamp("us", "UTC")),
                "_combined_source_position": pa.array(columns[5], pa.string()),
                # (only id 9's events name a Delivery the commits record: the
                # others are ranked as before)
                "_combined_delivery_id": [f"d-{name}" if i == 9 else None for i in columns[0]],
            }
        )
        files.append(str(tmp_path / f"{name}.parquet"))
        pq.write_table(table, files[-1])
    return EventLake(files, {"d-b": 7, "d-a": 8})


@pytest.mark.parametrize("numbered", [True, False])
def test_an_event_streams_marked_values_come_from_each_ids_newest_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, numbered: bool
) -> None:
    # An append dataset's reduction read no lake: a value its update left
    # alone landed as null, like a real SET ... = NULL. Its lake holds many
    # events of an id: the newest stands for the row.
    from combined.capture import _unchanged

    if not numbered:  # (DuckDB reads the lake's values, without the rows' numbers)
        monkeypatch.setattr(_unchanged, "lake_numbers_rows", lambda columns: False)
    files = _events_lake(tmp_path)
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    parts, schema = _change_stream(
        tmp_path,
        [("id", pa.int64()), ("name", pa.string()), ("n", pa.int64())],
        {
            "id": ids,
            "name": [None] * len(ids),
            "n": list(range(len(ids))),
            "_combined_op": ["update"] * len(ids),
            "_combined_unchanged": [["name"]] * len(ids),
        },
    )
    listed: list[int] = []

    def events() -> EventLake:
        listed.append(1)
        return files

    r = _appender(tmp_path, parts, schema, events)
    try:
        rows = r.con.execute("SELECT id, name FROM res ORDER BY _combined_ordinal").fetchall()
    finally:
        r.close()
    expected = {1: "new", 2: "new", 3: "new", 5: None, 6: "new", 7: None, 8: None, 9: "new"}
    if numbered:  # (without the rows' numbers, one transaction's changes tie)
        expected[4] = "new"
    assert [row for row in rows if row[0] in expected] == [
        (i, expected[i]) for i in ids if i in expected
    ]
    assert listed == [1]


def _appender(
    tmp_path: Path, parts: list[Path], schema: pa.Schema, events: Callable[[], EventLake]
) -> Reducer:
    """An event stream's (``sync_mode: append``) reduction, its lake's files ``events``."""
    return _stream_reducer(tmp_path, parts, schema, 64 * 2**20, events)


def test_an_event_stream_without_marked_values_lists_no_lake_file_and_a_move_is_an_insert(
    tmp_path: Path,
) -> None:
    # Only a change that leaves a value unchanged reads the lake. A key's
    # move that left a value alone arrives as the old key's delete naming it
    # and the new key's update: the stream kept "update" for a key that
    # never existed, where a move leaving nothing alone is an insert.
    def events() -> EventLake:
        raise AssertionError("the lake was listed with no value to fill")

    stream: dict[str, list[Any]] = {
        "id": [1, 1, 2],
        "name": ["a", "b", None],
        "_combined_op": ["insert", "update", "delete"],
        "_combined_unchanged": [None, [], None],
    }
    parts, schema = _change_stream(tmp_path, [("id", pa.int64()), ("name", pa.string())], stream)
    r = _appender(tmp_path, parts, schema, events)
    try:
        t = r.reduce()
    finally:
        r.close()
    assert (t.inserts, t.updates, t.deletes) == (1, 1, 1)

    files = _events_lake(tmp_path)
    moved: dict[str, list[Any]] = {
        "id": [1, 101, 2],
        "name": [None, None, None],
        "_combined_op": ["delete", "update", "update"],
        "_combined_unchanged": [["name"], ["name"], ["name"]],
    }
    parts, schema = _change_stream(
        tmp_path / "m", [("id", pa.int64()), ("name", pa.string())], moved
    )
    r = _appender(tmp_path, parts, schema, lambda: files)
    try:
        r.reduce()
        ops = r.con.execute("SELECT op FROM tr ORDER BY ord").fetchall()
        rows = r.con.execute("SELECT id, name FROM res ORDER BY _combined_ordinal").fetchall()
    finally:
        r.close()
    assert ops == [("delete",), ("insert",), ("update",)]
    assert rows[1:] == [(101, "new"), (2, "new")]
