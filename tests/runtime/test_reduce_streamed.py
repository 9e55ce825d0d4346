"""A snapshot's reduction streams the staged parts: same answers as the general path."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.capture import _databases, _duplicates, _fingerprint, _join
from combined.capture._reduce import (
    WHOLE_JOIN_SHARE,
    Reducer,
    Transition,
    _id_ranges,
    _in_range,
)
from combined.delivery import PartWriter, StagingArea, part_schema, read_part
from combined.delivery._staging import Limits
from combined.runtime._stage import CaptureStager

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def staged(
    tmp_path: Path, ids: list[int], tag: str = "n", first: int = 0
) -> tuple[list[Path], pa.Schema]:
    area = StagingArea(tmp_path / f"staging-{tag}", Limits())
    writer = PartWriter(area, "s/d/capture", max_rows=700, max_bytes=2**30)
    stager = CaptureStager(writer, key=["id"], hash_rows=True, first_ordinal=first)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        stager.put(
            pa.RecordBatch.from_pydict(
                {"id": chunk, "name": [f"{tag}{i}" if i % 5 else None for i in chunk]},
                schema=SCHEMA,
            )
        )
    parts = stager.close(SCHEMA)
    return parts, pa.unify_schemas([part_schema(p) for p in parts])


def part_table(path: Path) -> pa.Table:
    """A staged part's rows."""
    return pa.Table.from_batches(list(read_part(path)), schema=part_schema(path))


def write_part(table: pa.Table, path: Path) -> Path:
    """``table`` as a staged part at ``path`` (a new file: a read part stays mapped)."""
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    return path


def new_reducer(
    tmp_path: Path,
    parts: list[Path],
    schema: pa.Schema,
    *,
    strategy: str = "snapshot",
    current: list[str] | None = None,
    baseline: bool | None = None,
    same: bool = False,
) -> Reducer:
    """The reduction of staged ``parts`` (a first baseline unless ``current`` or ``baseline``).

    ``same``: staging found the capture equal to the committed one.
    """
    return Reducer(
        capture_files=parts,
        capture_schema=schema,
        current_files=current or [],
        key=["id"],
        strategy=strategy,
        sync_mode="incremental",
        memory_limit=64 * 2**20,
        spill_dir=tmp_path,
        baseline=not current if baseline is None else baseline,
        same=same,
    )


def reducer(
    tmp_path: Path,
    parts: list[Path],
    schema: pa.Schema,
    *,
    stream: bool,
    current: list[str] | None = None,
) -> Reducer:
    r = new_reducer(tmp_path, parts, schema, current=current)
    assert r.streamed and r.all_new == (not current)
    if not stream:  # the general path, materialising keys and tr
        r.streamed = r.all_new = False
    return r


CONSTANTS = {
    "observed_at": "2026-11-29T00:00:00+00:00",
    "ingested_at": "2026-11-29T00:00:01+00:00",
    "run_id": "r",
    "producer": "p",
    "position": None,
}


def both_paths(
    tmp_path: Path, parts: list[Path], schema: pa.Schema, current: list[str] | None = None
) -> list[tuple[Transition, pa.Table, pa.Table]]:
    """(transition, change list, delivered rows) of the streamed path, then of the general one."""
    results = []
    for stream in (True, False):
        r = reducer(tmp_path, parts, schema, stream=stream, current=current)
        try:
            assert r.duplicates() == []
            transition = r.reduce()
            changes = r.changes().read_all().sort_by("_combined_id")
            r.release()
            rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000))).sort_by("_combined_id")
            rows = rows.select(sorted(rows.column_names))  # the lake conversion orders them
        finally:
            r.close()
        results.append((transition, changes, rows))
    return results


def baseline_lake(tmp_path: Path) -> tuple[Path, pa.Schema]:
    """The lake's current rows as one file: a first baseline of ids 0..2999."""
    parts, schema = staged(tmp_path, list(range(3000)))
    r = reducer(tmp_path, parts, schema, stream=True)
    try:
        r.reduce()
        lake = pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))
    finally:
        r.close()
    current = tmp_path / "current.parquet"
    pq.write_table(lake, current)
    return current, schema


def test_streamed_first_baseline_matches_the_general_reduction(tmp_path: Path) -> None:
    parts, schema = staged(tmp_path, list(range(3000)))
    assert len(parts) > 1
    (t1, c1, o1), (t2, c2, o2) = both_paths(tmp_path, parts, schema)
    assert t1 == t2
    assert (t1.inserts, t1.captured, t1.updates, t1.deletes) == (3000, 3000, 0, 0)
    assert t1.digest != "0" * 32 and t1.content_xor != (0, 0)
    assert c1.equals(c2) and set(c1.column("op").to_pylist()) == {"insert"}
    assert o1.equals(o2) and set(o1.column("_combined_op").to_pylist()) == {"snapshot"}


@pytest.mark.parametrize("stream", [True, False])
def test_duplicates_found_without_materialising(tmp_path: Path, stream: bool) -> None:
    parts, schema = staged(tmp_path, [*range(1000), 7, 500, 7])
    r = reducer(tmp_path, parts, schema, stream=stream)
    try:
        dups = r.duplicates()
    finally:
        r.close()
    assert dups[0][0] < dups[1][0]  # ordered by id (hex)
    found = {count: ords for _, count, ords in dups}  # ordinals: the capture's row numbers
    assert found == {3: [7, 1000, 1002], 2: [500, 1001]}


@pytest.mark.parametrize("repeated", [True, False])
def test_a_first_baselines_duplicate_check_runs_beside_its_deliveries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeated: bool
) -> None:
    # Started ahead on a pool's thread, the prefix check runs while the
    # Deliveries are encoded; duplicates() takes its answer (the prefixes
    # are read once), and the exact check still names the repeated ids.
    ids = [*range(1000), 7, 500, 7] if repeated else list(range(1003))
    parts, schema = staged(tmp_path, ids)
    ran: list[str] = []
    prefixes = _duplicates.distinct_prefixes

    def where(*args: Any) -> bool:
        ran.append(threading.current_thread().name)
        return prefixes(*args)

    monkeypatch.setattr(_duplicates, "distinct_prefixes", where)
    r = reducer(tmp_path, parts, schema, stream=True)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="side") as pool:
            assert r.prefixes_ahead(pool)
            r.release()  # (as deliver() does before the Deliveries are encoded)
            rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))
            dups = r.duplicates()
    finally:
        r.close()
    assert rows.num_rows == len(ids)
    assert len(ran) == 1 and ran[0].startswith("side")
    found = {count: ords for _, count, ords in dups}
    assert found == ({3: [7, 1000, 1002], 2: [500, 1001]} if repeated else {})


def test_only_a_first_baselines_duplicate_check_runs_ahead(tmp_path: Path) -> None:
    parts, schema = staged(tmp_path, list(range(1000)))
    for r in (
        reducer(tmp_path, parts, schema, stream=False),  # (rows deduplicated by a join)
        new_reducer(tmp_path, parts, schema, strategy="cursor"),  # a first delta: ids distinct
    ):
        try:
            with ThreadPoolExecutor(1) as pool:
                assert not r.prefixes_ahead(pool)
        finally:
            r.close()


def without_fingerprints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reductions join every row (as when the fingerprints' checks refuse)."""
    monkeypatch.setattr(_fingerprint, "candidates", lambda *args, **kwargs: None)


@pytest.mark.parametrize("passes", [0, 1, 3, 4, 6])
def test_streamed_recapture_matches_the_general_reduction(
    tmp_path: Path, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The join runs in ``passes`` id ranges (sized by the reduction memory):
    # every pass count gives the same transition, and so do the fingerprints
    # (``passes`` 0), which join only the rows that may have changed.
    found: list[Any] = []
    if passes:
        without_fingerprints(monkeypatch)
    else:
        from combined.capture._fingerprint import candidates

        def recorded(*args: Any, **kwargs: Any) -> Any:
            found.append(candidates(*args, **kwargs))
            return found[-1]

        monkeypatch.setattr(_fingerprint, "candidates", recorded)
    monkeypatch.setattr(_join, "JOIN_BYTES_PER_ROW", 64 * 2**20 // (3000 // max(passes, 1) + 1))
    current, schema = baseline_lake(tmp_path)
    # Again, ids 100..3099: 0..99 deleted, 3000..3099 inserted; names of ids
    # that are multiples of 7 changed ("m"), the others as they were.
    again = [i for i in range(100, 3100) if i % 7]
    changed = [i for i in range(100, 3100) if i % 7 == 0]
    parts_a, _ = staged(tmp_path, again, "n")
    parts_b, _ = staged(tmp_path, changed, "m", first=len(again))  # one capture: ordinals go on
    probe = reducer(tmp_path, [*parts_a, *parts_b], schema, stream=True, current=[str(current)])
    probe.close()
    assert probe._join_passes(len(again) + len(changed)) == max(passes, 1)
    (t1, c1, o1), (t2, c2, o2) = both_paths(
        tmp_path, [*parts_a, *parts_b], schema, current=[str(current)]
    )
    assert t1 == t2
    if not passes:  # the candidates: the changed rows of both sides, and no other
        (only,) = found
        assert only.staged.num_rows == t1.inserts + t1.updates
        assert only.current.num_rows == t1.deletes + t1.updates
    unchanged_names = sum(1 for i in changed if i < 3000 and i % 5 == 0)  # null stays null
    assert (t1.inserts, t1.deletes) == (100, 100)
    assert t1.updates == sum(1 for i in changed if i < 3000) - unchanged_names
    assert t1.unchanged == len(again) + len(changed) - 100 - t1.updates
    assert c1.equals(c2)
    names = dict(zip(o1.column("id").to_pylist(), o1.column("name").to_pylist(), strict=True))
    assert names[3003] == "m3003" and names[3001] == "n3001" and names[147] == "m147"
    assert 140 not in names  # a null name "changed" to null: unchanged
    assert o1.select(["id", "name", "_combined_op"]).equals(
        o2.select(["id", "name", "_combined_op"])
    )


def test_a_column_added_mid_read_reaches_the_deliveries_on_both_paths(tmp_path: Path) -> None:
    from combined.lake import lake_schema, to_lake
    from combined.protocol import _provenance as prov

    wide = SCHEMA.append(pa.field("extra", pa.string()))
    area = StagingArea(tmp_path / "staging", Limits())
    writer = PartWriter(area, "s/d/capture", max_rows=10_000, max_bytes=2**30)
    stager = CaptureStager(writer, key=["id"], hash_rows=True)
    stager.put(pa.RecordBatch.from_pydict({"id": [1, 2], "name": ["a", "b"]}, schema=SCHEMA))
    stager.put(pa.RecordBatch.from_pydict({"id": [3], "name": ["c"], "extra": ["x"]}, schema=wide))
    parts = stager.close(SCHEMA)
    assert len(parts) == 2  # the wider batch started a part of its own
    schema = pa.unify_schemas([part_schema(p) for p in parts], promote_options="permissive")
    lake = lake_schema(pa.schema([f for f in schema if not f.name.startswith("_combined_")]))
    for field in prov.provenance_fields("binary"):
        lake = lake.append(field)
    tables = []
    for stream in (True, False):
        r = reducer(tmp_path, parts, schema, stream=stream)
        try:
            r.reduce()
            batches = [to_lake(b, lake) for b in r.output(CONSTANTS, 1000)]
        finally:
            r.close()
        tables.append(pa.Table.from_batches(batches, schema=lake).sort_by("id"))
    assert tables[0].equals(tables[1])
    assert tables[0].column("extra").to_pylist() == [None, None, "x"]


def _ids_in_ranges(ids: list[Any], column_type: str, ranges: list[Any]) -> list[Any]:
    import duckdb

    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE t (_cid {column_type})")
        con.executemany("INSERT INTO t VALUES (?)", [[i] for i in ids])
        return [
            r[0]
            for low, high in ranges
            for r in con.execute(
                f"SELECT _cid FROM t WHERE {_in_range('_cid', low, high)}"
            ).fetchall()
        ]
    finally:
        con.close()


@pytest.mark.parametrize("passes", [1, 2, 3, 4, 6, 7, 16])
def test_join_id_ranges_hold_every_id_exactly_once(passes: int) -> None:
    ranges = _id_ranges(passes)
    assert len(ranges) == passes
    ids = ["", "0", "0f", "3", "4", "4000", "7fff", "8", "9z", "a", "c", "f", "ff", "g", "Z", "~"]
    ids += [format(i * 2654435761 % 2**128, "032x") for i in range(500)]
    assert sorted(_ids_in_ranges(ids, "VARCHAR", ranges)) == sorted(ids)


@pytest.mark.parametrize("passes", [1, 2, 3, 4, 6, 7, 16, 255])
def test_join_id_ranges_hold_every_binary_id_exactly_once(passes: int) -> None:
    ranges = _id_ranges(passes, "binary")
    assert len(ranges) == passes
    ids = [b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"\xff" * 16, b"\x00" * 16]
    ids += [(i * 2654435761 % 2**128).to_bytes(16, "big") for i in range(500)]
    assert sorted(_ids_in_ranges(ids, "BLOB", ranges)) == sorted(ids)


def test_a_delta_meets_only_the_current_rows_of_its_own_ids(tmp_path: Path) -> None:
    current, schema = baseline_lake(tmp_path)
    # A cursor read of ids 2990..3009: 10 known (names changed), 10 new.
    delta, _ = staged(tmp_path, list(range(2990, 3010)), "m")
    r = new_reducer(tmp_path, delta, schema, strategy="cursor", current=[str(current)])
    try:
        t = r.reduce()
        (held,) = r.con.execute("SELECT count(*) FROM curk").fetchall()[0]
    finally:
        r.close()
    assert (t.inserts, t.updates, t.deletes) == (10, 10 - 2, 0)  # 2990, 2995: null names
    assert held == 10  # the lake's other 2,990 ids were never materialised


def test_a_first_cursor_read_of_distinct_ids_streams_like_a_first_baseline(
    tmp_path: Path,
) -> None:
    parts, schema = staged(tmp_path, list(range(3000)))
    results = []
    for stream in (True, False):
        r = new_reducer(tmp_path, parts, schema, strategy="cursor")
        try:
            assert r.all_new and r.streamed
            if not stream:
                r.streamed = r.all_new = False  # the general path: keys, window, tr
            transition = r.reduce()
            changes = r.changes().read_all().sort_by("_combined_id")
            r.release()
            rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000))).sort_by("_combined_id")
        finally:
            r.close()
        results.append((transition, changes, rows.select(sorted(rows.column_names))))
    (t1, c1, o1), (t2, c2, o2) = results
    assert t1 == t2 and (t1.inserts, t1.captured) == (3000, 3000)
    assert c1.equals(c2) and o1.equals(o2)


def test_a_first_cursor_read_repeating_an_id_keeps_its_last_row(tmp_path: Path) -> None:
    parts_a, schema = staged(tmp_path, [*range(10), 3], "n")
    parts_b, _ = staged(tmp_path, [3], "m", first=11)  # one capture: ordinals go on
    r = new_reducer(tmp_path, [*parts_a, *parts_b], schema, strategy="cursor")
    try:
        assert not r.all_new  # repeated ids: deduplicated, never streamed
        t = r.reduce()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))
    finally:
        r.close()
    assert (t.inserts, t.captured) == (10, 12)
    names = dict(zip(rows.column("id").to_pylist(), rows.column("name").to_pylist(), strict=True))
    assert names[3] == "m3" and len(names) == 10


def test_the_transition_digest_tells_operations_rows_and_payloads_apart() -> None:
    from combined.capture._reduce import transition_digest

    a, b = 0x1234 << 64 | 0x5678, 0x9ABC << 64 | 0xDEF0
    assert transition_digest({}) == transition_digest({"insert": None}) == "0" * 32
    digests = {
        transition_digest({"insert": a}),
        transition_digest({"update": a}),  # the same term, another operation
        transition_digest({"snapshot": a}),
        transition_digest({"delete": a}),
        transition_digest({"truncate": a}),  # an event stream's truncate counts too
        transition_digest({"insert": a ^ b}),  # one more row
        transition_digest({"insert": a, "update": b}),
        transition_digest({"insert": b, "update": a}),
    }
    assert len(digests) == 8 and "0" * 32 not in digests
    assert transition_digest({"insert": a}) == transition_digest({"insert": a, "delete": 0})


def test_swapping_two_rows_payloads_changes_the_transition_digest(tmp_path: Path) -> None:
    # The digest folds each row's (id, hash) pair, not ids and hashes apart.
    parts, schema = staged(tmp_path, [1, 2], "n")
    t = part_table(parts[0])
    hashes = t.column("_combined_payload_hash").to_pylist()
    i = t.schema.get_field_index("_combined_payload_hash")
    swapped = write_part(
        t.set_column(i, "_combined_payload_hash", pa.array(hashes[::-1])),
        tmp_path / "swapped.arrow",
    )
    digests = []
    for files in (parts, [swapped]):
        r = new_reducer(tmp_path, files, schema)
        try:
            digests.append(r.reduce())
        finally:
            r.close()
    assert digests[0].inserts == digests[1].inserts == 2
    assert digests[0].digest != digests[1].digest
    assert digests[0].content_xor != digests[1].content_xor


def _general(tmp_path: Path, parts: list[Path], schema: pa.Schema, current: Path) -> Transition:
    r = reducer(tmp_path, parts, schema, stream=False, current=[str(current)])
    try:
        assert not r.same_as_current()  # the general path never takes the shortcut
        return r.reduce()
    finally:
        r.close()


def test_an_unchanged_recapture_needs_neither_join_nor_duplicate_check(tmp_path: Path) -> None:
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(reversed(range(3000))), "n")  # another order, same rows
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert r.same_as_current()
        assert r.duplicates() == []
        t = r.reduce()
        tables = r.con.execute("SELECT table_name, estimated_size FROM duckdb_tables()").fetchall()
        r.release()
        assert r.changes().read_all().num_rows == 0  # and nothing to deliver
        assert sum(b.num_rows for b in r.output(CONSTANTS, 1000)) == 0
    finally:
        r.close()
    assert tables == [("tr", 0)]  # no keys, nothing joined: an empty transition
    assert t == _general(tmp_path, parts, schema, current)
    assert (t.unchanged, t.captured, t.changes) == (3000, 3000, 0)


def test_a_capture_staging_found_unchanged_never_opens_a_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging's fold verdict (``same``) reduces without DuckDB; a later reader gets ``tr``."""
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(range(3000)), "n")
    opened: list[int] = []

    def counted(memory_mb: int, spill_dir: Path) -> Any:
        opened.append(memory_mb)
        return _databases.open_database(memory_mb, spill_dir)

    monkeypatch.setattr("combined.capture._reduce.open_database", counted)
    for reads_after in (False, True):
        r = new_reducer(tmp_path, parts, schema, current=[str(current)], same=True)
        try:
            assert r.duplicates() == [] and r.same_as_current()
            t = r.reduce()
            assert (t.unchanged, t.captured, t.changes) == (3000, 3000, 0)
            assert opened == []
            if reads_after:  # (a change stream's moved position reads its empty transition)
                assert r.changes().read_all().num_rows == 0
                assert sum(b.num_rows for b in r.output(CONSTANTS, 1000)) == 0
                assert len(opened) == 1
        finally:
            r.close()
    assert t == _general(tmp_path, parts, schema, current)


def test_swapped_payloads_or_a_repeated_row_are_changes_not_an_unchanged_recapture(
    tmp_path: Path,
) -> None:
    current, schema = baseline_lake(tmp_path)
    # The same ids and the same payload hashes, two of them swapped between rows.
    parts, _ = staged(tmp_path, list(range(3000)), "n")
    t = part_table(parts[0])
    i = t.schema.get_field_index("_combined_payload_hash")
    hashes = t.column(i).to_pylist()
    hashes[1], hashes[2] = hashes[2], hashes[1]
    parts[0] = write_part(
        t.set_column(i, "_combined_payload_hash", pa.array(hashes)), tmp_path / "swapped.arrow"
    )
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert not r.same_as_current()
        swapped = r.reduce()
    finally:
        r.close()
    assert (swapped.updates, swapped.unchanged) == (2, 2998)
    assert swapped == _general(tmp_path, parts, schema, current)
    # As many rows as the lake, one of them twice in place of another.
    parts, _ = staged(tmp_path, [i for i in range(3000) if i != 5] + [7], "n")
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert not r.same_as_current()
        assert [(count, ords) for _, count, ords in r.duplicates()] == [(2, [6, 2999])]
    finally:
        r.close()


def test_rows_without_a_hash_never_make_a_recapture_look_unchanged(tmp_path: Path) -> None:
    # DuckDB hashes NULL to a constant: two lake rows without a payload hash
    # would cancel out of the fold, and a capture repeating a row in their
    # place would pass for unchanged (and skip the duplicate check).
    current, schema = baseline_lake(tmp_path)
    t = pq.read_table(current)
    i = t.schema.get_field_index("_combined_payload_hash")
    ids = t.column("id").to_pylist()
    hashes = [None if n in (0, 1) else h for n, h in zip(ids, t.column(i).to_pylist(), strict=True)]
    pq.write_table(
        t.set_column(i, t.schema.field(i), pa.array(hashes, t.schema.field(i).type)), current
    )
    parts, _ = staged(tmp_path, [*range(2, 3000), 5, 5], "n")
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert not r.same_as_current()
        assert [count for _, count, _ in r.duplicates()] == [3]
    finally:
        r.close()


def _joins(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan["name"] == "HASH_JOIN" else []
    return found + [j for child in plan["children"] for j in _joins(child)]


def _scans(plan: dict[str, Any]) -> set[str]:
    return {plan["name"]} | {s for child in plan["children"] for s in _scans(child)}


def test_the_output_join_builds_on_the_transition_never_on_the_staged_parts(
    tmp_path: Path,
) -> None:
    # DuckDB knows no row count for the staged parts' stream (it takes it for
    # one row): left to choose, it would build its hash table on the whole
    # capture, every column of it (~500 MB at 2M rows) to deliver 1% of it.
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, [*range(1, 3000), 5000], "m")  # every named row changed
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        t = r.reduce()
        assert (t.inserts, t.updates, t.deletes) == (1, 2400, 1)
        (plan,) = json.loads(
            r.con.execute("EXPLAIN (FORMAT json) " + r._output_sql()).fetchall()[0][1]
        )
        (join,) = _joins(plan)
        probe, build = join["children"]
        assert "PYTHON_ARROW_SCAN" in _scans(probe)
        assert "PYTHON_ARROW_SCAN" not in _scans(build)
        rows = sum(b.num_rows for b in r.output(CONSTANTS, 1000))
    finally:
        r.close()
    assert rows == 2402


def test_a_column_duckdb_cannot_scan_as_staged_is_scanned_in_a_type_it_can(
    tmp_path: Path,
) -> None:
    # DuckDB's Arrow scan refuses float16: the staged parts keep the column as
    # read (the Deliveries convert it), their stream hands DuckDB float32.
    schema = pa.schema([("id", pa.int64()), ("h", pa.float16())])
    writer = PartWriter(StagingArea(tmp_path / "st", Limits()), "s/d/capture", 1000, 2**30)
    stager = CaptureStager(writer, key=["id"], hash_rows=True)
    halves = pa.array([15360, 16384, 0], pa.uint16()).view(pa.float16())  # 1.0, 2.0, 0.0
    stager.put(pa.RecordBatch.from_arrays([pa.array([1, 2, 3]), halves], schema=schema))
    parts = stager.close(schema)
    assert part_schema(parts[0]).field("h").type == pa.float16()
    for stream in (True, False):
        r = reducer(tmp_path, parts, part_schema(parts[0]), stream=stream)
        try:
            assert r.duplicates() == []
            assert r.reduce().inserts == 3
            assert r.con.execute("SELECT sum(h) FROM pay").fetchall() == [(3.0,)]
            r.release()
            assert sum(b.num_rows for b in r.output(CONSTANTS, 1000)) == 3
        finally:
            r.close()


def test_a_capture_much_smaller_than_the_lake_still_joins_in_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The join's hash table holds the lake's side: its passes are sized by
    # the larger side, here the lake (3000 ids) against a capture of 100.
    # (1500 ids a pass of the join's share of the 64 MB: WHOLE_JOIN_SHARE)
    monkeypatch.setattr(_join, "JOIN_BYTES_PER_ROW", 64 * 2**20 // WHOLE_JOIN_SHARE // 1501)
    without_fingerprints(monkeypatch)
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(range(100)), "n")
    passes: list[int] = []
    sized = Reducer._join_passes

    def recorded(self: Reducer, rows: int, memory: int | None = None) -> int:
        passes.append(sized(self, rows, memory))
        return passes[-1]

    monkeypatch.setattr(Reducer, "_join_passes", recorded)
    (t1, c1, _), (t2, c2, _) = both_paths(tmp_path, parts, schema, current=[str(current)])
    assert passes == [2, 2]  # the streamed path's join, then the general path's
    assert t1 == t2 and c1.equals(c2)
    assert (t1.deletes, t1.unchanged) == (2900, 100)
