"""Table maintenance: compaction, vacuum, and reading a version through its compaction.

A maintenance commit (an ``OPTIMIZE`` that compacts small files, the two
commits of a ``VACUUM``) changes no row. It carries ``{"maintenance": kind}``
in Combined's commit metadata, so it is neither a foreign write nor a
checkpoint (:meth:`LakeTable.commits` skips it).

A publication names the lake version its capture committed. When only
maintenance commits follow that version, the newest of them holds exactly
the same rows in fewer files: :func:`reading_version` finds it, and queries
read it instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from combined.lake._table import MAINTENANCE, METADATA_KEY, LakeTable, post_commit


@dataclass(frozen=True)
class Compaction:
    """What compacting a table did."""

    files_before: int
    files_removed: int
    files_added: int
    lake_version: int


def _properties(kind: str, **body: Any) -> Any:
    from deltalake import CommitProperties

    meta = {MAINTENANCE: kind, **body}
    return CommitProperties(custom_metadata={METADATA_KEY: json.dumps(meta, default=str)})


#: A data file under this size is small: what many small captures leave (a
#: few rows a file) and what a capture's compaction is for. A snapshot's
#: Deliveries (several MB each) are not: compacting them after every large
#: snapshot rewrote the whole table in the capture (a 4M-row snapshot's peak
#: went from ~330 to ~820 MB) and gained its readers nothing.
SMALL_FILE_BYTES = 1 << 20


#: The largest file a capture's own compaction writes, and the largest it reads:
#: delta-rs bins every file under its target, so the table's default target
#: (100 MB) made 33 small CDC commits rewrite a whole table of 7 MB files. At
#: twice :data:`SMALL_FILE_BYTES`, no two files that are not small fit one bin:
#: a compaction reads its small files and at most one larger file a bin.
CAPTURE_TARGET_BYTES = 2 * SMALL_FILE_BYTES


def file_count(table: LakeTable) -> int:
    """How many data files the table's newest version holds (0 before its first commit)."""
    dt = table.delta()
    return 0 if dt is None else len(dt.file_uris())


def small_file_count(table: LakeTable) -> int:
    """How many of the newest version's data files are under :data:`SMALL_FILE_BYTES`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dt = table.delta()
    if dt is None:
        return 0
    sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
    return int(pc.sum(pc.less(sizes, SMALL_FILE_BYTES)).as_py() or 0)


def compact(table: LakeTable, reason: str, *, target: int | None = None) -> Compaction | None:
    """Rewrite the table's small files into few large ones, in one maintenance commit.

    ``target``: the largest file read or written (the table's own target,
    100 MB by default, when None). None when there is nothing to compact (no
    table, or one file).
    """
    table.forget_shared()
    dt = table.delta()
    if dt is None:
        return None
    before = len(dt.file_uris())
    if before < 2:
        return None
    metrics = dt.optimize.compact(
        target_size=target,
        commit_properties=_properties("compact", reason=reason),
        post_commithook_properties=post_commit(),
    )
    removed = int(metrics.get("numFilesRemoved", 0))
    if not removed:
        return None
    version = table.version()
    assert version is not None
    return Compaction(
        files_before=before,
        files_removed=removed,
        files_added=int(metrics.get("numFilesAdded", 0)),
        lake_version=version,
    )


def vacuum(table: LakeTable, keep_versions: set[int], policy: str) -> list[str]:
    """Delete the files the table no longer holds, except those ``keep_versions`` read.

    Only files a commit removed (tombstones) are candidates, so a file a
    concurrent writer has not committed yet is never one. Returns the
    removed files (relative to the table).
    """
    table.forget_shared()
    dt = table.delta()
    if dt is None:
        return []
    head = int(dt.version())
    keep = sorted({v for v in keep_versions if v <= head} | {head})
    listed = dt.vacuum(
        retention_hours=0, dry_run=True, enforce_retention_duration=False, keep_versions=keep
    )
    # (a tombstone stays in the log after its file is gone: listed again, not removed again)
    present = [f for f in listed if table.store.exists(table.store.child(table.path, f))]
    if not present:
        return []  # nothing to remove: no commit either
    dt.vacuum(
        retention_hours=0,
        dry_run=False,
        enforce_retention_duration=False,
        keep_versions=keep,
        commit_properties=_properties("vacuum", policy=policy, kept_versions=keep),
        post_commithook_properties=post_commit(),
    )
    return present


def reading_version(table: LakeTable, version: int, *, reading: bool = False) -> int:
    """The newest version holding exactly ``version``'s rows: past its maintenance commits.

    Reads the commit files after ``version`` one at a time (usually none or
    one), stopping at the first that is not a maintenance commit. ``reading``:
    for a read alone, its requests bounded (:attr:`LakeStore.reading_fs`).
    """
    store = table.store
    log = store.child(table.path, "_delta_log")
    current = version
    while True:
        raw = store.read_bytes(store.child(log, f"{current + 1:020d}.json"), reading=reading)
        if raw is None or not _maintenance_commit(raw):
            return current
        current += 1


def _maintenance_commit(raw: bytes) -> bool:
    """Whether a Delta commit file is one of Combined's maintenance commits."""
    for line in raw.splitlines():
        if b'"commitInfo"' not in line:
            continue
        info = json.loads(line).get("commitInfo", {})
        meta = info.get(METADATA_KEY)
        if isinstance(meta, str):
            meta = json.loads(meta)
        return isinstance(meta, dict) and MAINTENANCE in meta
    return False
