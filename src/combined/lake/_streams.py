"""What a source's first captures made on its server, kept in the project's lake.

A PostgreSQL first capture makes a replication slot, reads the snapshot it
exported, then commits. Killed in between, it leaves a slot and no
checkpoint; its retry must tell that leftover from a slot another project
or a person made under the same name, and only the project that made the
slot can know. The source records what it made (``abc.StreamRecords``);
this keeps each record as ``<lake>/_combined/streams/<key>.json``, in the
lake (not the catalog) so that a catalog rebuilt from the lake keeps it,
like the project's id (``_project.py``).

A record is written whole or not at all (``write_whole``: a local file
replaces the old one by a rename, an object store's upload appears once
complete; a write that fails leaves the old record) and is its owner's alone (``0600`` in a ``0700``
directory; an object store's access is the bucket's).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from combined._owner_only import private_dir
from combined.errors import ConfigError, LakeError
from combined.lake._layout import LakeLayout
from combined.lake._probe import read_failure, store_failure
from combined.lake._store import LakeStore

__all__ = ["LakeStreamRecords", "read_json", "write_whole"]

_KEY = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class LakeStreamRecords:
    """``abc.StreamRecords`` kept in the lake of ``layout``."""

    def __init__(self, layout: LakeLayout) -> None:
        self._store = layout.store
        self._dir = layout.store.join("_combined", "streams")

    def keep(self, key: str, record: Mapping[str, str]) -> None:
        """Keep ``record`` under ``key``, replacing the one kept there."""
        path = self._path(key)
        try:
            write_whole(self._store, self._dir, path, json.dumps(dict(record), sort_keys=True))
        except OSError as exc:
            raise store_failure(
                f"the lake's stream record ({path}) could not be written",
                exc,
                "what the record was to name is undone",
            ) from None

    def kept(self, key: str) -> dict[str, str] | None:
        """The record kept under ``key``; None when there is none."""
        path = self._path(key)
        found, record = read_json(self._store, path, "the lake's stream record")
        if not found:
            return None
        if not isinstance(record, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in record.items()
        ):
            raise LakeError(
                f"the lake's stream record ({path}) is not one Combined wrote",
                hint="it was changed by another tool: delete it (the slot it names is then "
                "refused until it is dropped by hand) or restore it from a backup of the lake",
            )
        return record

    def _path(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ConfigError(
                f"stream record key {key!r} is not letters, digits, '_', '.' and '-'",
                hint="this is a defect of the connector: report it",
            )
        return self._store.child(self._dir, f"{key}.json")


def write_whole(store: LakeStore, directory: str, path: str, text: str) -> None:
    """Replace the record at ``path`` (in ``directory``) by ``text``, whole or not at all,
    its owner's alone: a write that fails leaves the record it was to replace.

    A local file replaces the old one by a rename, in a ``0700`` directory;
    an object store's upload replaces the old object once complete. Not
    through ``LakeStore.written`` there, which deletes the object when the
    write fails: a store failing one request would have removed the record
    (a position a source was acknowledged at, ``_positions.py``).
    """
    data = text.encode()
    if store.remote:
        with store.fs.open_output_stream(store.path(path)) as out:
            out.write(data)
        return
    private_dir(Path(directory))
    with store.written(path) as (target, _):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def read_json(store: LakeStore, path: str, what: str) -> tuple[bool, Any]:
    """Whether a record is at ``path``, and its JSON value (None where it is not JSON).

    ``what`` names the record in the error of a store that fails the read.
    """
    try:
        raw = store.read_bytes(path)
    except OSError as exc:
        raise read_failure(f"{what} ({path}) could not be read", exc) from None
    if raw is None:
        return False, None
    try:
        return True, json.loads(raw)
    except ValueError:
        return True, None
