"""Orphans: files in a dataset's lake directories that nothing names.

A writer killed between writing a file and the commit that names it (a
SIGKILL, a power loss, a lost race of the MAR table) leaves the file behind:
a data file of the dataset's table, of its MAR (``_usage/``) or history
(``_history/``) table, or a file of its raw layer (``_deliveries/``). Vacuum
never sees them: it removes only files a commit removed.

Here they are found, never removed (``combined._orphans`` decides that).
Conservative throughout: only a directory's own Parquet files are listed
(none of its subdirectories, none named ``_...`` as Delta's own are, no
hidden file but Combined's partial ones, no other kind of file), and a Delta
table whose log does not start at version 0 (entries removed by another
engine) is not judged at all: the files its lost entries named cannot be
told.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from combined.lake._store import LakeStore
from combined.lake._table import METADATA_KEY

#: A Delta log entry's name: its version, 20 digits.
_ENTRY = re.compile(r"^(\d{20})\.json$")
#: The hidden files Combined itself writes (a partial write's, a restore's).
_PARTIAL = re.compile(r"^\..+\.(partial|restoring)$")
#: Log entries read at once from an object store.
_READERS = 8


@dataclass(frozen=True)
class LakeFile:
    """A file of a lake directory: where, its name there, bytes and modification time."""

    location: str
    name: str
    size: int
    modified: datetime


class LogIncomplete(Exception):
    """A Delta table's log that is not whole: what it named cannot all be told.

    It does not start at version 0 (entries another engine removed), or an
    entry went or cannot be read.
    """


def listed(store: LakeStore, folder: str) -> list[LakeFile]:
    """The files of ``folder`` that may be judged (none when it is not there)."""
    return [f for f in _entries(store, folder) if _candidate(f.name)]


def _candidate(name: str) -> bool:
    """Whether a file may be judged: a Parquet file (data, Delivery) or a partial write of one.

    Never Delta's own (``_delta_log``, ``_change_data``), a hidden file, nor
    any other kind: a deletion vector's file, for one, is named in the log by
    an encoded id, not by its path.
    """
    if _PARTIAL.match(name):
        return True
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def _entries(store: LakeStore, folder: str) -> Iterator[LakeFile]:
    if not store.remote:
        try:
            scanned = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in scanned:
            if entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                when = datetime.fromtimestamp(st.st_mtime, UTC)
                yield LakeFile(entry.path, entry.name, st.st_size, when)
        return
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(store.path(folder), recursive=False, allow_not_found=True)
    for info in store.fs.get_file_info(selector):
        if info.type != pafs.FileType.File or info.mtime is None:
            continue  # (a "directory", or a store that gives no time: kept)
        when = info.mtime if info.mtime.tzinfo else info.mtime.replace(tzinfo=UTC)
        yield LakeFile(store.child(folder, info.base_name), info.base_name, int(info.size), when)


def log_versions(store: LakeStore, table: str) -> list[int]:
    """The versions of a Delta table's log entries, oldest first (empty: no table)."""
    log = store.child(table, "_delta_log")
    versions = sorted(int(m.group(1)) for f in _entries(store, log) if (m := _ENTRY.match(f.name)))
    if versions and versions[0] != 0:
        raise LogIncomplete(f"its Delta log starts at version {versions[0]}")
    return versions


def referenced(store: LakeStore, table: str, versions: Iterable[int]) -> tuple[set[str], set[str]]:
    """What the log's ``versions`` name: data files, and raw-layer files of Combined's commits.

    Data files: every path an entry adds, removes or gives as a change file,
    relative ones as the table's directory holds them (unquoted), absolute
    ones as written. Raw-layer files: each commit's Deliveries and change
    list, by name (from Combined's metadata in its ``commitInfo``).
    """
    log, versions = store.child(table, "_delta_log"), list(versions)
    names = [store.child(log, f"{v:020d}.json") for v in versions]
    with ThreadPoolExecutor(max_workers=_READERS if store.remote else 1) as pool:
        entries = list(pool.map(store.read_bytes, names))
    paths: set[str] = set()
    raw_names: set[str] = set()
    for version, raw in zip(versions, entries, strict=True):
        if raw is None:  # (an entry gone since it was listed: another engine's cleanup)
            raise LogIncomplete(f"its Delta log entry {version} went while it was read")
        try:
            _named_in(raw, paths, raw_names)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise LogIncomplete(f"its Delta log entry {version} cannot be read ({exc})") from exc
    return paths, raw_names


def _named_in(entry: bytes, paths: set[str], raw_names: set[str]) -> None:
    """Add what one log entry names to ``paths`` (data files) and ``raw_names``."""
    for line in entry.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        for kind in ("add", "remove", "cdc"):
            if isinstance(action.get(kind), dict) and action[kind].get("path"):
                paths.add(unquote(str(action[kind]["path"])))
        if isinstance(action.get("commitInfo"), dict):
            raw_names |= _raw_files(action["commitInfo"].get(METADATA_KEY))


def _raw_files(meta: Any) -> set[str]:
    """The raw-layer files a commit's Combined metadata names (its Deliveries, change list)."""
    if isinstance(meta, str):
        meta = json.loads(meta)
    if not isinstance(meta, dict):
        return set()
    names = {str(d["file"]) for d in meta.get("deliveries") or [] if d.get("file")}
    return names | ({str(meta["changes_file"])} if meta.get("changes_file") else set())


def unnamed(files: list[LakeFile], names: set[str]) -> list[LakeFile]:
    """``files`` that ``names`` (paths relative to their directory, or absolute) does not hold.

    An absolute path (a shallow clone's, another engine's) holds every file of
    its name, wherever it points: under another alias of the store it would
    not compare equal, and a data file's name is unique anyway.
    """
    absolute = {n.rstrip("/").rsplit("/", 1)[-1] for n in names if "://" in n or n[:1] == "/"}
    return [f for f in files if f.name not in names and f.name not in absolute]


def moved_on(store: LakeStore, table: str, head: int | None) -> bool:
    """Whether a Delta table has a log entry past ``head`` (None: it had none)."""
    after = 0 if head is None else head + 1
    return store.exists(store.child(store.child(table, "_delta_log"), f"{after:020d}.json"))
