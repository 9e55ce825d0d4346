"""A first baseline's reduction streams the staged parts: same answers as the general path."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.capture._reduce import Reducer
from combined.delivery import PartWriter, StagingArea
from combined.delivery._staging import Limits
from combined.runtime._stager import CaptureStager

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def staged(tmp_path: Path, ids: list[int]) -> tuple[list[Path], pa.Schema]:
    area = StagingArea(tmp_path / "staging", Limits())
    writer = PartWriter(area, "s/d/capture", max_rows=700, max_bytes=2**30)
    stager = CaptureStager(writer, key=["id"], hash_rows=True)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        stager.put(
            pa.RecordBatch.from_pydict(
                {"id": chunk, "name": [f"n{i}" if i % 5 else None for i in chunk]}, schema=SCHEMA
            )
        )
    parts = stager.close(SCHEMA)
    return parts, pa.unify_schemas([pq.read_schema(p) for p in parts])


def reducer(tmp_path: Path, parts: list[Path], schema: pa.Schema, *, stream: bool) -> Reducer:
    r = Reducer(
        capture_files=parts,
        capture_schema=schema,
        current_files=[],
        key=["id"],
        strategy="snapshot",
        sync_mode="incremental",
        memory_limit=64 * 2**20,
        spill_dir=tmp_path,
        baseline=True,
    )
    assert r.all_new
    r.all_new = stream  # False: the general path, materialising keys and tr
    return r


CONSTANTS = {
    "observed_at": "2026-11-29T00:00:00+00:00",
    "ingested_at": "2026-11-29T00:00:01+00:00",
    "run_id": "r",
    "producer": "p",
    "position": None,
}


def test_streamed_first_baseline_matches_the_general_reduction(tmp_path: Path) -> None:
    parts, schema = staged(tmp_path, list(range(3000)))
    assert len(parts) > 1
    results = []
    for stream in (True, False):
        r = reducer(tmp_path, parts, schema, stream=stream)
        try:
            assert r.duplicates() == []
            transition = r.reduce()
            changes = r.changes().read_all().sort_by("_combined_id")
            r.release()
            rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000))).sort_by("id")
        finally:
            r.close()
        results.append((transition, changes, rows))
    (t1, c1, o1), (t2, c2, o2) = results
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
    ordinal = {i: i for i in range(1000)}
    assert dups[0][0] < dups[1][0]  # ordered by id (hex)
    found = {count: ords for _, count, ords in dups}
    assert found == {3: [ordinal[7], 1000, 1002], 2: [ordinal[500], 1001]}
