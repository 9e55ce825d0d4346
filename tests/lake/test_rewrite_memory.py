"""The copy-on-write of files of long lists holds a bounded working set (a fresh process)."""

from __future__ import annotations

import functools
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
    assert 2 * _rewrite.in_flight(pq.ParquetFile(paths[0]).metadata) > _rewrite.REWRITE_BYTES
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


# FILES files of ROWS rows made by MAKE (written BATCH rows at a time), every
# STEP-th row of each file gone: the peak RSS of their rewrite over its
# start, in a fresh interpreter.
_PROBE = """
import sys
import tempfile
from pathlib import Path
import numpy as np
from combined.lake import _rewrite
from combined.lake._files import write_data_files
from combined.lake._store import LakeStore
from combined.runtime._memory import release_memory
from tests.lake import test_rewrite_memory

make = getattr(test_rewrite_memory, sys.argv[1])
files, rows, batch, step = (int(a) for a in sys.argv[2:])

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

with tempfile.TemporaryDirectory() as tmp:
    lake = LakeStore.at(tmp)
    paths = []
    for n in range(files):
        table = make(n * rows, rows, n)
        (action,) = write_data_files(tmp, table.schema, table.to_batches(batch), lake)
        paths.append(str(Path(tmp) / action.path))
    schema = table.schema
    del table
    doomed = {p: np.arange(0, rows, step) for p in paths}
    release_memory()
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    _rewrite._rewritten(tmp, paths, schema, doomed, False, lake)
    print((status("VmHWM") - base) >> 20)
"""


def rewrite_peak_mb(make: str, files: int, rows: int, batch: int, step: int) -> int:
    """The rise of RSS while :data:`_PROBE` rewrites its files, in MB."""
    root = Path(__file__).resolve().parents[2]
    argv = [make, *(str(n) for n in (files, rows, batch, step))]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True, cwd=root
    )
    return int(out.stdout)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_rewrite_of_files_of_long_lists_holds_little_memory() -> None:
    # Two files at once, each read with read-ahead over its row groups and
    # decoded on threads, rose 305-317 MB here; one file at a time, a row
    # group at a time, ~146 MB. The limit sits far from both.
    # (four files of 12,000 rows of int[1000], 48 MB of Arrow each, 1% of each file's rows gone)
    assert rewrite_peak_mb("lists", 4, 12_000, 2000, 100) < 225


def provenance(first: int, rows: int, seed: int = 0) -> pa.Table:
    """``rows`` rows with three constant 300-character strings (a Delivery's provenance).

    ``seed`` is unused: the probe makes every table as :func:`lists` does.
    """
    ids = np.arange(first, first + rows)
    return pa.table(
        {
            "id": ids,
            "_combined_id": pa.array([i.to_bytes(16, "big") for i in ids.tolist()], pa.binary()),
            **{
                f"_combined_{name}": pa.array([name * (300 // len(name))] * rows, pa.string())
                for name in ("run_id", "delivery_id", "producer")
            },
        }
    )


def test_constant_strings_are_rewritten_as_dictionaries_and_read_back_as_strings(
    tmp_path: Path,
) -> None:
    lake = LakeStore.at(str(tmp_path))
    table = provenance(0, 20_000)
    (action,) = write_data_files(str(tmp_path), table.schema, table.to_batches(5000), lake)
    path = str(tmp_path / action.path)
    names = ["_combined_run_id", "_combined_delivery_id", "_combined_producer"]
    assert _rewrite._dictionary_columns(pq.read_metadata(path), table.schema) == names
    doomed = {path: np.arange(0, 20_000, 3)}
    actions = _rewrite._rewritten(str(tmp_path), [path], table.schema, doomed, False, lake)
    (added,) = [a.path for a in actions if type(a).__name__ == "AddAction"]
    kept = pq.read_table(tmp_path / added)
    assert kept.schema == table.schema  # (strings to every reader)
    expected = table.filter(pa.array(np.arange(20_000) % 3 != 0))
    assert kept.equals(expected)
    meta = pq.read_metadata(tmp_path / added)
    assert _rewrite._dictionary_columns(meta, table.schema) == names


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_rewrite_of_constant_strings_holds_little_memory() -> None:
    # Decoded as strings, each of the two files rewritten at once held its
    # row group of ~950-byte rows gathering, a batch read and its filtered
    # copy: 140-142 MB over the start here; read as dictionaries, 21-23 MB.
    # (eight files of 100,000 such rows, a third of each file's rows gone)
    assert rewrite_peak_mb("provenance", 8, 100_000, 10_000, 3) < 60


def texts(first: int, rows: int, seed: int) -> pa.Table:
    """``rows`` rows of ~300 bytes of text each, as the bench's wide table's (none repeats)."""
    ids = np.arange(first, first + rows)
    letters = np.random.default_rng(seed).integers(97, 123, rows * 300, dtype=np.uint8)
    offsets = pa.array(np.arange(0, rows * 300 + 1, 300, dtype=np.int32))
    return pa.table(
        {
            "id": ids,
            "body": pa.StringArray.from_buffers(rows, offsets.buffers()[1], pa.py_buffer(letters)),
            "_combined_id": pa.array([i.to_bytes(16, "big") for i in ids.tolist()], pa.binary()),
            "_combined_op": pa.array(["insert"] * rows),
        }
    )


# A table of FILES files of ROWS rows of texts(), committed in the parent; the
# probe commits new texts for every STEP-th row of each, in a fresh
# interpreter, and prints the most Arrow memory its pool held meanwhile.
_COMMIT = """
import sys
import numpy as np
import pyarrow as pa
from combined.lake._table import LakeTable
from tests.lake.test_rewrite_memory import texts

root, files, rows, step = sys.argv[1], *(int(a) for a in sys.argv[2:])
table = LakeTable(root, "t")
changed = texts(0, files * rows // step, files)  # (new texts: a small table)
changed = changed.set_column(0, "id", pa.array(np.arange(0, files * rows, step)))
ids = [int(i).to_bytes(16, "big") for i in range(0, files * rows, step)]
changed = changed.set_column(2, "_combined_id", pa.array(ids, pa.binary()))
changed = changed.set_column(3, "_combined_op", pa.array(["update"] * changed.num_rows))
pool = pa.default_memory_pool()
start = pool.bytes_allocated()
table.commit(
    first_sequence=files + 1,
    last_sequence=files + 1,
    mode="merge",
    data=lambda: pa.RecordBatchReader.from_batches(changed.schema, changed.to_batches()),
    metadata={},
)
print((pool.max_memory() - start) >> 20)
"""


def test_a_commit_rewrites_files_of_wide_rows_within_its_bytes_in_flight(tmp_path: Path) -> None:
    # Files of ~300-byte texts (the bench's wide table's rows), each of
    # whose rewrite holds ~48 MB of Arrow memory at its peak, were rewritten
    # two at a time: 85 MB at once. Their bytes in flight (in_flight) do not
    # let two fit in the rewrite's budget: one at a time, 48 MB.
    from combined.lake._table import LakeTable

    files, rows = 4, 60_000
    table = LakeTable(str(tmp_path), "t")
    for n in range(files):
        batch = texts(n * rows, rows, n)
        table.commit(
            first_sequence=n + 1,
            last_sequence=n + 1,
            mode="append",
            data=functools.partial(
                pa.RecordBatchReader.from_batches, batch.schema, batch.to_batches()
            ),
            metadata={},
        )
    assert len(table.files()) == files
    assert 2 * _rewrite.in_flight(pq.read_metadata(table.files()[0])) > _rewrite.REWRITE_BYTES
    root = Path(__file__).resolve().parents[2]
    argv = [str(tmp_path), str(files), str(rows), "100"]
    out = subprocess.run(
        [sys.executable, "-c", _COMMIT, *argv], capture_output=True, text=True, check=True, cwd=root
    )
    assert int(out.stdout) <= _rewrite.REWRITE_BYTES >> 20
    after = LakeTable(str(tmp_path), "t")
    assert after.delta().to_pyarrow_table(columns=["id"]).num_rows == files * rows
