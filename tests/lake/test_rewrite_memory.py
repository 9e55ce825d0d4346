"""The copy-on-write of files of long lists holds a bounded working set (a fresh process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from combined.lake import _rewrite
from combined.lake._files import write_data_files
from combined.lake._store import LakeStore


def lists(first: int, rows: int, seed: int) -> pa.Table:
    """``rows`` rows of an int[1000] (nearly distinct values: no dictionary pays)."""
    ids = np.arange(first, first + rows)
    values = np.random.default_rng(seed).integers(0, 1_000_003, rows * 1000, dtype=np.int32)
    offsets = pa.array(np.arange(0, rows * 1000 + 1, 1000, dtype=np.int32))
    return pa.table(
        {
            "id": ids,
            "xs": pa.ListArray.from_arrays(offsets, pa.array(values)),
            "_combined_id": pa.array([i.to_bytes(16, "big") for i in ids.tolist()], pa.binary()),
        }
    )


def test_files_of_wide_rows_are_rewritten_one_at_a_time_and_keep_their_rows(
    tmp_path: Path,
) -> None:
    lake = LakeStore.at(str(tmp_path))
    paths, tables = [], []
    for n in range(3):
        table = lists(n * 300, 300, n)
        (action,) = write_data_files(str(tmp_path), table.schema, table.to_batches(100), lake)
        paths.append(str(tmp_path / action.path))
        tables.append(table)
    assert _rewrite._wide(pq.ParquetFile(paths[0]).metadata)
    doomed = {p: np.arange(0, 300, 7) for p in paths[1:]}
    actions = _rewrite._rewritten(str(tmp_path), paths, tables[0].schema, doomed, False, lake)
    added = [a.path for a in actions if type(a).__name__ == "AddAction"]
    kept = pa.concat_tables(pq.read_table(tmp_path / p) for p in added)
    expected = {i for t in tables[1:] for i in t.column("id").to_pylist()} - {
        300 * f + k for f in (1, 2) for k in range(0, 300, 7)
    }
    assert sorted(kept.column("id").to_pylist()) == sorted(expected)
    assert kept.sort_by("id").column("xs").to_pylist()[:1] == (
        tables[1].filter(pc.equal(tables[1].column("id"), 301)).column("xs").to_pylist()
    )


# Four files of 12,000 rows of int[1000] (48 MB of Arrow each), 1% of each
# file's rows gone: the peak RSS of their rewrite over its start, in a fresh
# interpreter.
_PROBE = """
import tempfile
from pathlib import Path
import numpy as np
from combined.lake import _rewrite
from combined.lake._files import write_data_files
from combined.lake._store import LakeStore
from combined.runtime._memory import release_memory
from tests.lake.test_rewrite_memory import lists

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

rows = 12_000
with tempfile.TemporaryDirectory() as tmp:
    lake = LakeStore.at(tmp)
    paths = []
    for n in range(4):
        table = lists(n * rows, rows, n)
        (action,) = write_data_files(tmp, table.schema, table.to_batches(2000), lake)
        paths.append(str(Path(tmp) / action.path))
    schema = table.schema
    del table
    doomed = {p: np.arange(0, rows, 100) for p in paths}
    release_memory()
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    _rewrite._rewritten(tmp, paths, schema, doomed, False, lake)
    print((status("VmHWM") - base) >> 20)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_rewrite_of_files_of_long_lists_holds_little_memory() -> None:
    # Two files at once, each read with read-ahead over its row groups and
    # decoded on threads, rose 305-317 MB here; one file at a time, a row
    # group at a time, ~146 MB. The limit sits far from both.
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, cwd=root
    )
    assert int(out.stdout) < 225
