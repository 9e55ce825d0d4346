"""A snapshot re-capture joined row by row (most rows changed) stays within DuckDB's share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.runtime.test_reduce_streamed import (
    CONSTANTS,
    baseline_lake,
    staged,
    without_fingerprints,
)

from combined.capture import _join
from combined.capture._reduce import WHOLE_JOIN_PASSES, WHOLE_JOIN_SHARE, Reducer, Transition

MEMORY = 256 * 2**20


def _reducer(tmp_path: Path, parts: list[Path], schema: pa.Schema, current: Path) -> Reducer:
    return Reducer(
        capture_files=parts,
        capture_schema=schema,
        current_files=[str(current)],
        key=["id"],
        strategy="snapshot",
        sync_mode="incremental",
        memory_limit=MEMORY,
        spill_dir=tmp_path,
        baseline=False,
    )


def _duck_mib(con: Any) -> float:
    """DuckDB's memory limit now, in MiB (it reads back as ``'61.0 MiB'``)."""
    (text,) = con.execute("SELECT current_setting('memory_limit')").fetchall()[0]
    number, unit = text.split()
    return float(number) * {"KiB": 2**-10, "MiB": 1, "GiB": 2**10}[unit]


def _reduced(
    tmp_path: Path, parts: list[Path], schema: pa.Schema, current: Path, stream: bool
) -> tuple[Transition, pa.Table, pa.Table]:
    r = _reducer(tmp_path, parts, schema, current)
    try:
        if not stream:  # the general path: every row hashed into ``keys`` first
            r.streamed = False
        assert r.duplicates() == []
        transition = r.reduce()
        changes = r.changes().read_all().sort_by("_combined_id")
        r.release()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 1000)))
        rows = rows.select(["_combined_id", "_combined_op", "id", "name"]).sort_by("_combined_id")
    finally:
        r.close()
    return transition, changes, rows


@pytest.mark.parametrize("stream", [True, False])
def test_a_recapture_whose_every_row_changed_joins_in_passes_within_a_share_of_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Every row of 3000 renamed, 100 deleted, 100 new: joined in DuckDB, not gathered.

    At the whole reduction memory a 2M-row re-capture of this kind held
    DuckDB's tables of every row (keys, the lake's, the transition) in
    memory on top of what the process held, and peaked ~530 MB. The join
    now gets a quarter of it, and goes in passes over id ranges sized by
    that quarter (here 1600 ids a pass: 2 passes of 3100 ids, at most
    ``WHOLE_JOIN_PASSES``); the result
    is the one pass's.
    """
    without_fingerprints(monkeypatch)  # (as when too many fingerprints are one-sided)
    monkeypatch.setattr(_join, "JOIN_BYTES_PER_ROW", MEMORY // WHOLE_JOIN_SHARE // 1600)
    seen: list[tuple[float, int | None]] = []
    join = Reducer._join_current

    def recorded(self: Reducer, *args: Any, **kwargs: Any) -> Transition:
        seen.append((_duck_mib(self.con), kwargs.get("passes")))
        return join(self, *args, **kwargs)

    monkeypatch.setattr(Reducer, "_join_current", recorded)
    current, schema = baseline_lake(tmp_path)  # ids 0..2999, names "n<id>" (null at id % 5 == 0)
    parts, _ = staged(tmp_path, list(range(100, 3100)), "m")
    transition, changes, rows = _reduced(tmp_path, parts, schema, current, stream)
    ((mib, passes),) = seen  # (DuckDB's "MB" are 10**6 bytes: 64 MB read back as 61.0 MiB)
    assert (mib, passes) == (round(MEMORY // WHOLE_JOIN_SHARE // 2**20 * 10**6 / 2**20, 1), 2)
    # A null name stays null: those rows are unchanged; every other one is renamed.
    renamed = [i for i in range(100, 3000) if i % 5]
    assert (transition.inserts, transition.deletes) == (100, 100)
    assert (transition.updates, transition.unchanged) == (len(renamed), 2900 - len(renamed))
    ops = dict(
        zip(rows.column("id").to_pylist(), rows.column("_combined_op").to_pylist(), strict=True)
    )
    assert sorted(i for i, op in ops.items() if op == "update") == renamed
    assert sorted(i for i, op in ops.items() if op == "insert") == list(range(3000, 3100))
    lake = pq.read_table(current, columns=["id", "_combined_id"])
    gone = {d for i, d in zip(*lake.to_pydict().values(), strict=True) if i < 100}
    deleted = changes.filter(pc.equal(changes.column("op"), "delete"))
    assert set(deleted.column("_combined_id").to_pylist()) == gone and len(gone) == 100
    names = dict(zip(rows.column("id").to_pylist(), rows.column("name").to_pylist(), strict=True))
    assert all(names[i] == f"m{i}" for i in renamed)
    assert changes.num_rows == transition.changes == 100 + 100 + len(renamed)
    # One pass (the whole share's worth of ids) gives the same transition, changes and rows.
    monkeypatch.setattr(_join, "JOIN_BYTES_PER_ROW", 1)
    assert _reduced(tmp_path, parts, schema, current, stream) == (transition, changes, rows)
    assert seen[-1][1] == 1
    # Smaller passes are capped: each scans both sides' spilled tables again.
    monkeypatch.setattr(_join, "JOIN_BYTES_PER_ROW", MEMORY // WHOLE_JOIN_SHARE // 100)
    assert _reduced(tmp_path, parts, schema, current, stream) == (transition, changes, rows)
    assert seen[-1][1] == WHOLE_JOIN_PASSES == 2


def test_a_recapture_of_1m_rows_all_changed_is_joined_whole_not_gathered(tmp_path: Path) -> None:
    """The wide shape's 1M rows all changed: 2M one-sided fingerprints, under the
    ~2.1M the whole reduction memory allowed, were gathered and joined in memory
    (~520 MB at the peak). A quarter of it allows ~524k: they are joined whole."""
    current, schema = baseline_lake(tmp_path)
    parts, _ = staged(tmp_path, list(range(10)), "m")
    r = _reducer(tmp_path, parts, schema, current)
    try:
        assert r._most_candidates() == MEMORY // 4 // 128 < 2 * 1_000_000
    finally:
        r.close()
