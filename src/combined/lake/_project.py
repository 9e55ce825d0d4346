"""The project's id: random, kept in its lake, the same for every process of the project.

What Combined makes on a provider's server must be told apart from what
another project made there: a PostgreSQL publication carries the id of the
project whose capture made it (docs/cdc.md, "Two projects, one table"). The
id lives in the lake, not in the catalog, so a catalog rebuilt from the lake
(``combined repair``) keeps it; nothing else names a project for good (its
directory, its lake's URL and its catalog may all move).

``<lake>/_combined/project`` is a Delta table whose first version holds one
row, the ``id`` (32 hex digits); it is made the first time an id is asked
for and never written again (maintenance leaves it alone: it is not one of
the ledger's tables). Two processes that make it at once race for the log's
first entry, which the store lets one of them write (put-if-absent, as every
Delta commit here). The loser's write may land as a later version (delta-rs
retries a conflicting creation as the next one): the id is always the first
version's, which every process reads, the loser included.
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from combined.errors import LakeError
from combined.lake._layout import LakeLayout
from combined.lake._probe import read_failure, store_failure
from combined.lake._table import LakeTable

__all__ = ["existing_project_id", "project_id"]

_SCHEMA = pa.schema([("id", pa.string())])


def project_id(layout: LakeLayout) -> str:
    """The project's id, made (and kept in the lake) the first time it is asked for."""
    table = _table(layout)
    found = _first(table)
    if found is not None:
        return found
    made = uuid.uuid4().hex
    batch = pa.record_batch([pa.array([made])], schema=_SCHEMA)
    from deltalake.exceptions import DeltaError

    try:
        table.append_batches(_SCHEMA, iter([batch]), create=True, metadata={"project": made})
    except (OSError, DeltaError) as exc:
        found = _first(table)  # (another process made it first: its id is the project's)
        if found is None:
            raise store_failure(
                f"the lake's project id ({table.path}) could not be written",
                exc,
                "nothing was made on the source's server",
            ) from None
        return found
    return _first(table) or made


def existing_project_id(layout: LakeLayout) -> str | None:
    """The project's id when its lake holds one; None before it is made (nothing written:
    for a command that only reads, such as ``combined check`` or ``cdc status``)."""
    return _first(_table(layout))


def _table(layout: LakeLayout) -> LakeTable:
    return LakeTable(layout.store.join("_combined", "project"), "", layout.store)


def _first(table: LakeTable) -> str | None:
    """The id in the table's first version; None before it is made."""
    from deltalake.exceptions import DeltaError

    try:
        files = table.files(version=0)
    except (OSError, DeltaError) as exc:
        raise read_failure(f"the lake's project id ({table.path}) could not be read", exc) from None
    for path in files:
        ids = table.store.read_table(path).column("id").to_pylist()
        if ids and isinstance(ids[0], str):
            return ids[0]
    if files:
        raise LakeError(
            f"the lake's project id ({table.path}) holds no id",
            hint="it was changed by another tool: restore it from a backup of the lake",
        )
    return None
