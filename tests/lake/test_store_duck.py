"""A local lake's checks share the process's DuckDB database instead of opening one each."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.lake._store import LakeStore
from combined.quality import range_totals


def test_range_totals_of_local_lakes_open_one_database_in_all(
    tmp_path: Path, duck_opens: list[object]
) -> None:
    # Opening a DuckDB database costs ~14 ms of CPU: a capture of 200 small
    # tables opened one for each table's control total and one for its nulls.
    results = []
    for lake in ("a", "b"):
        root = tmp_path / lake
        root.mkdir()
        files = []
        for n in range(2):
            path = root / f"part-{n}.parquet"
            pq.write_table(pa.table({"id": [1, 2, 3], "v": [n, n + 1, n + 2]}), path)
            files.append(str(path))
        store = LakeStore.at(root)
        for where in (None, "id >= 2", "v > 100"):
            results.append(range_totals(files, where, "v", store)[:2])
    assert results == [(6, "9"), (4, "8"), (0, None)] * 2
    assert len(duck_opens) == 1
    with LakeStore.at(tmp_path / "a").duck() as con:  # (each a connection of its own)
        assert con.execute("SELECT 1").fetchall() == [(1,)]
    assert len(duck_opens) == 1
