"""A snapshot re-capture reduced by fingerprints: its transition, its checks, its duplicates."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tests.runtime.test_reduce_streamed import (
    CONSTANTS,
    _general,
    baseline_lake,
    new_reducer,
    part_table,
    staged,
    write_part,
)

from combined.capture import _fingerprint as fp
from combined.capture import _output


@pytest.mark.parametrize("row_bytes", [fp.PRINT_BYTES_PER_ROW, 2**20])  # at once; 64 buckets
def test_a_recapture_joins_only_the_rows_whose_fingerprints_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row_bytes: int
) -> None:
    # (2**20 bytes a row: ~3,000 rows take 64 buckets of 64 MB of reduction memory)
    monkeypatch.setattr(fp, "PRINT_BYTES_PER_ROW", row_bytes)
    current, schema = baseline_lake(tmp_path)
    # ids 0..2899 again (100 deleted), 290 of them renamed ("m"), 50 new
    kept = [i for i in range(2900) if i % 10 != 1]
    renamed = [i for i in range(2900) if i % 10 == 1]
    parts_a, _ = staged(tmp_path, [*kept, *range(5000, 5050)], "n")
    parts_b, _ = staged(tmp_path, renamed, "m", first=len(kept) + 50)
    parts = [*parts_a, *parts_b]
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert r.duplicates() == []
        found = r.by_fingerprints()
        assert found is not None and r.reduce() == found
        assert (r._spill(3000) is None) == (row_bytes < 2**20)
        # (neither the pass join nor the staged duplicate check ran: tr holds the changes)
        tables = r.con.execute("SELECT table_name, estimated_size FROM duckdb_tables()").fetchall()
    finally:
        r.close()
    assert (found.inserts, found.deletes, found.updates) == (50, 100, len(renamed))
    assert found.unchanged == len(kept)
    assert tables == [("tr", 150 + len(renamed))]
    assert found == _general(tmp_path, parts, schema, current)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("held_as", ["heap", "mapped file"])
def test_the_fingerprints_leave_room_for_the_memory_the_process_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_as: str
) -> None:
    # 4M rows' fingerprints (128 MB) fit a reduction memory 192 MB over
    # what the process holds: sorted at once. With 128 MB more held (the
    # extraction's leftovers, or the pages of the libraries' code a capture
    # maps), only 64 MB are left: by bucket. The reduction memory alone
    # (over 192 MB), or less the heaps alone, chose at once either way.
    # (No floor: a process holding much already, as a test worker may, would reach it.)
    monkeypatch.setattr(fp, "PRINT_ROOM_SHARE", 2**20)
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(range(100)), "m")
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        status = Path("/proc/self/status").read_text().split("VmRSS:")[1]
        r.memory_limit = int(status.split()[0]) * 1024 + 192 * 2**20
        assert r._spill(4_000_000) is None
        with _held(tmp_path, 128 * 2**20, held_as):
            assert r._spill(4_000_000) is not None
    finally:
        r.close()


@contextmanager
def _held(tmp_path: Path, size: int, held_as: str) -> Iterator[None]:
    """``size`` bytes resident while in the block: a touched array, or a file's mapped pages."""
    if held_as == "heap":
        held = np.ones(size, np.uint8)  # (touched: resident)
        assert held.sum() == size
        yield
        return
    path = tmp_path / "mapped"
    path.write_bytes(b"\1" * size)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pages = range(0, size, mmap.PAGESIZE)
        assert sum(mapped[i] for i in pages) == len(pages)  # (every page read: resident)
        yield


@pytest.mark.parametrize(
    ("extra", "ordinals"),
    [
        # a lake row again with another payload: one copy matches the lake, one does not
        ([(7, "m")], [7, 3000]),
        # a new id twice, with two payloads
        ([(5001, "m"), (5001, "x")], [3000, 3001]),
        # a new id twice, the same row: a fingerprint repeated within the capture
        ([(5001, "m"), (5001, "m")], [3000, 3001]),
    ],
)
def test_a_repeated_id_is_found_though_the_fingerprints_leave_rows_out(
    tmp_path: Path, extra: list[tuple[int, str]], ordinals: list[int]
) -> None:
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(range(3000)), "n")
    for n, (i, tag) in enumerate(extra):
        parts += staged(tmp_path / f"extra{n}", [i], tag, first=3000 + n)[0]
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert r.by_fingerprints() is None  # the exact check decides
        dups = r.duplicates()
    finally:
        r.close()
    assert [(count, ords) for _, count, ords in dups] == [(2, ordinals)]


def _digests(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _reader(*columns: list[bytes] | list[int]) -> fp.Reader:
    def read() -> Iterator[pa.RecordBatch]:
        arrays = [
            pa.array(c, pa.int64() if isinstance(c[0], int) else pa.binary()) for c in columns
        ]
        yield pa.RecordBatch.from_arrays(arrays, names=[f"c{k}" for k in range(len(arrays))])

    return read


def _words(digest: bytes) -> np.ndarray:
    return np.frombuffer(digest, np.uint64)


def test_two_pairs_sharing_a_fingerprint_are_caught_by_the_check_words() -> None:
    ids, hashes = _digests(100), _digests(100)
    ords = list(range(100))
    assert fp.candidates(_reader(ords, ids, hashes), 100, _reader(ids, hashes), 100) is not None
    # The lake's row 0 is another pair (id and hash) with the capture's row 0's fingerprint.
    other = _digests(1)[0]
    i, h, h2 = _words(ids[0]), _words(hashes[0]), _words(other)
    first = i[:1] ^ (h[:1] * fp._K1) ^ (h2[:1] * fp._K1)  # (arrays: their products wrap)
    forged = np.concatenate([first, i[1:] ^ np.uint64(1)]).tobytes()
    lake_ids, lake_hashes = [forged, *ids[1:]], [other, *hashes[1:]]
    a = fp.prints(pa.array([ids[0]]), pa.array([hashes[0]]))
    b = fp.prints(pa.array([forged]), pa.array([other]))
    assert a is not None and b is not None and a.f[0] == b.f[0] and forged != ids[0]
    assert (
        fp.candidates(_reader(ords, ids, hashes), 100, _reader(lake_ids, lake_hashes), 100) is None
    )


def test_digests_not_16_bytes_long_are_joined_exactly() -> None:
    ids, hashes = _digests(10), _digests(10)
    short = [*ids[:9], ids[9][:15]]
    assert fp.digest_words(pa.array(short, pa.binary())) is None
    assert fp.digest_words(pa.array([*ids[:9], None], pa.binary())) is None
    assert (
        fp.candidates(_reader(list(range(10)), short, hashes), 10, _reader(ids, hashes), 10) is None
    )
    words = fp.digest_words(pa.array(ids, pa.binary()).slice(3))
    assert words is not None and words.tobytes() == b"".join(ids[3:])


def test_a_fallback_reduction_gives_the_same_transition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, [i for i in range(3100) if i % 3], "m")
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        fast = r.reduce()
    finally:
        r.close()
    monkeypatch.setattr(fp, "candidates", lambda *args, **kwargs: None)
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        assert r.by_fingerprints() is None
        joined = r.reduce()
    finally:
        r.close()
    assert fast == joined == _general(tmp_path, parts, schema, current)


def _delivered(tmp_path: Path, parts: list[Path], schema: pa.Schema, current: Path) -> pa.Table:
    r = new_reducer(tmp_path, parts, schema, current=[str(current)])
    try:
        r.reduce()
        r.release()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))
    finally:
        r.close()
    return rows.sort_by("_combined_id")


@pytest.mark.parametrize("window", [_output.TAKE_BYTES, 100])
def test_the_rows_taken_from_the_parts_are_the_rows_the_join_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """Taken a window at a time (100 bytes: a few rows), from parts of several batches."""
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, [i for i in range(3100) if i % 3], "m")
    monkeypatch.setattr(_output, "TAKE_BYTES", window)
    taken = _recording(monkeypatch)
    fast = _delivered(tmp_path, parts, schema, current)
    assert len(taken) == len(parts) and -1 not in taken  # every part taken from
    monkeypatch.setattr(_output, "_taken", lambda *args: None)
    joined = _delivered(tmp_path, parts, schema, current)
    # 1600 renamed (a null name stays null), 66 new ids, 1000 deletes (the lake's ids 0, 3, ...)
    assert fast.num_rows == 1600 + 66 + 1000
    assert fast.equals(joined.cast(fast.schema))


def test_a_part_whose_ordinals_do_not_follow_its_rows_is_joined_in_duckdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, [i for i in range(3100) if i % 3], "m")
    table = part_table(parts[0])
    ordinals = table.column("_combined_ordinal").to_pylist()[::-1]  # not one by one from the first
    parts[0] = write_part(
        table.set_column(
            table.schema.get_field_index("_combined_ordinal"),
            "_combined_ordinal",
            pa.array(ordinals, pa.int64()),
        ),
        tmp_path / "reversed.arrow",
    )
    taken = _recording(monkeypatch)
    fast = _delivered(tmp_path, parts, schema, current)
    assert taken[0] == -1 and -1 not in taken[1:]  # only that part is joined
    monkeypatch.setattr(_output, "_taken", lambda *args: None)
    assert fast.equals(_delivered(tmp_path, parts, schema, current).cast(fast.schema))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows :func:`_output._taken` takes from each part (-1: it declined), as it runs."""
    taken: list[int] = []
    real = _output._taken

    def recorded(*args: Any) -> _output._Taken | None:
        rows = real(*args)
        taken.append(-1 if rows is None else rows.num_rows)
        return rows

    monkeypatch.setattr(_output, "_taken", recorded)
    return taken


def test_too_many_changed_rows_are_left_to_the_join_that_spills() -> None:
    """A re-capture whose every row changed made every fingerprint one-sided, and their
    rows were gathered in memory (~700 MB at 2M rows): past ``most`` one-sided
    fingerprints the caller joins every row instead."""
    ids, hashes, changed = _digests(100), _digests(100), _digests(100)
    ords = list(range(100))
    few = [*hashes[:90], *changed[90:]]  # 10 rows changed: 20 one-sided fingerprints
    assert fp.candidates(_reader(ords, ids, few), 100, _reader(ids, hashes), 100, most=20)
    assert fp.candidates(_reader(ords, ids, few), 100, _reader(ids, hashes), 100, most=19) is None
    assert fp.candidates(_reader(ords, ids, changed), 100, _reader(ids, hashes), 100) is not None
    everything = fp.candidates(_reader(ords, ids, changed), 100, _reader(ids, hashes), 100, most=50)
    assert everything is None
