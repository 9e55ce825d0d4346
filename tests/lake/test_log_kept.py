"""A table's log is never cut: every version stays readable, every commit's evidence too.

delta-rs, at each checkpoint it writes after a commit (every
``delta.checkpointInterval`` commits, 100 by default), removes the log entries
older than ``delta.logRetentionDuration`` (30 days by default) that precede
it. A dataset table a month old and past its second checkpoint then loses
its older versions: a publication made at one of them could no longer be
read, and ``explain``, ``replay`` and ``repair`` would no longer find those
commits' Deliveries. Combined's commits keep the checkpoints and never cut
the log; removing anything from the lake is ``combined maintain``'s
recorded decision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from combined.lake import LakeTable

SCHEMA = pa.schema([("n", pa.int64())])
#: A table that asks for the shortest retention and a checkpoint every 3 commits.
EAGER = {"delta.checkpointInterval": "3", "delta.logRetentionDuration": "interval 0 seconds"}


def _rows(n: int) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(SCHEMA, [pa.record_batch([pa.array([n])], SCHEMA)])


def _commit(table: LakeTable, sequences: range) -> None:
    """One Combined commit of one row for each delivery sequence."""
    for seq in sequences:
        table.commit(
            first_sequence=seq,
            last_sequence=seq,
            mode="append",
            data=lambda seq=seq: _rows(seq),  # type: ignore[misc]
            metadata={"run_id": f"r{seq}", "first_sequence": seq, "last_sequence": seq},
            needs_merge=False,
        )


def test_commits_checkpoint_the_table_but_never_remove_its_log(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(path, _rows(0), configuration=EAGER)
    table = LakeTable(path, "combined:s/d")
    _commit(table, range(1, 12))
    log = path / "_delta_log"
    assert any(p.name.endswith(".checkpoint.parquet") for p in log.iterdir())
    assert (log / f"{0:020d}.json").exists()
    for version in range(12):
        assert DeltaTable(path, version=version).to_pyarrow_table().num_rows == version + 1
    assert [m["lake_version"] for m in table.commits()] == list(range(11, 0, -1))


def test_a_table_made_before_the_interval_was_configured_is_checkpointed_every_ten(
    tmp_path: Path,
) -> None:
    # Without a checkpoint, every load of the table reads every log entry:
    # a capture on an object store made ~30 such loads, so its requests grew
    # with the table's age (220 at the first capture, 693 at the fourth).
    path = tmp_path / "t"
    write_deltalake(path, _rows(0))  # delta-rs's defaults: a checkpoint every 100 versions
    table = LakeTable(path, "combined:s/d")
    _commit(table, range(1, 11))
    checkpoints = sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints == [f"{9:020d}.checkpoint.parquet"]  # where delta-rs puts them


def test_a_new_table_asks_delta_rs_for_a_checkpoint_every_ten_versions(tmp_path: Path) -> None:
    table = LakeTable(tmp_path / "t", "")
    for n in range(12):
        table.append_batches(SCHEMA, iter(_rows(n)), create=n == 0, metadata={"n": n})
    checkpoints = sorted(p.name for p in (tmp_path / "t" / "_delta_log").glob("*.checkpoint*"))
    assert checkpoints == [f"{9:020d}.checkpoint.parquet"]


def test_the_newest_commit_is_found_reading_the_log_from_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A capture asks for the newest commit (its checkpoint) and the usage
    # table's: both read every entry of the log before, however old the table.
    path = tmp_path / "t"
    table = LakeTable(path, "combined:s/d")
    _commit(table, range(1, 31))
    read: list[int | None] = []
    real = DeltaTable.history

    def history(self: DeltaTable, limit: int | None = None) -> Any:
        read.append(limit)
        return real(self, limit)

    monkeypatch.setattr(DeltaTable, "history", history)
    newest = table.latest_commit()
    assert newest is not None and newest["last_sequence"] == 30 and read == [8]
    read.clear()
    old = table.newest_commit(lambda m: m["last_sequence"] <= 3)
    assert old is not None and old["last_sequence"] == 3 and read == [8, 32]
    assert table.newest_commit(lambda m: False) is None
