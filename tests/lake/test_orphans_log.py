"""What a Delta log names, for judging orphans: every version, and only a whole log."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from combined.lake import LakeStore
from combined.lake._orphans import LogIncomplete, listed, log_versions, referenced, unnamed


def _table(tmp_path: Path) -> tuple[LakeStore, str]:
    store, table = LakeStore.at(tmp_path), str(tmp_path / "t")
    for i in range(3):
        write_deltalake(table, pa.table({"x": [i]}), mode="append" if i else "error")
    write_deltalake(table, pa.table({"x": [9]}), mode="overwrite")  # removes the three
    return store, table


def test_every_file_any_version_names_is_named_removed_ones_too(tmp_path: Path) -> None:
    store, table = _table(tmp_path)
    (tmp_path / "t" / "part-lost-c000.zstd.parquet").write_bytes(b"x")
    (tmp_path / "t" / "notes.txt").write_bytes(b"x")  # not a data file: never judged
    files = listed(store, table)
    assert len(files) == 5 and "notes.txt" not in {f.name for f in files}
    paths, raw = referenced(store, table, log_versions(store, table))
    assert len(DeltaTable(table).file_uris()) == 1 and len(paths) == 4 and not raw
    assert [f.name for f in unnamed(files, paths)] == ["part-lost-c000.zstd.parquet"]
    # an absolute path names the file of its name, whatever alias of the store it uses
    elsewhere = {f"s3://other/alias/{f.name}" for f in files}
    assert unnamed(files, elsewhere) == []


def test_a_log_that_is_not_whole_is_refused(tmp_path: Path) -> None:
    store, table = _table(tmp_path)
    log = tmp_path / "t" / "_delta_log"
    entry = log / f"{2:020d}.json"
    entry.write_text(entry.read_text() + "{not json\n")
    with pytest.raises(LogIncomplete, match="entry 2 cannot be read"):
        referenced(store, table, log_versions(store, table))
    (log / f"{0:020d}.json").unlink()
    with pytest.raises(LogIncomplete, match="starts at version 1"):
        log_versions(store, table)


def test_raw_layer_files_are_named_by_combineds_commit_metadata(tmp_path: Path) -> None:
    from deltalake import CommitProperties

    store, table = LakeStore.at(tmp_path), str(tmp_path / "t")
    meta = {"deliveries": [{"file": "000000001-a.parquet"}], "changes_file": "c.parquet"}
    write_deltalake(
        table,
        pa.table({"x": [1]}),
        commit_properties=CommitProperties(custom_metadata={"combined": json.dumps(meta)}),
    )
    _, raw = referenced(store, table, log_versions(store, table))
    assert raw == {"000000001-a.parquet", "c.parquet"}
