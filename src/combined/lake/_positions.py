"""Where a dataset's reads resume after captures that changed none of its rows.

A capture whose read moved the source's position (a change stream past
other tables' WAL and its own end marker, a cursor past rows the lake holds
unchanged) while changing no row has nothing to deliver. Committing the
position to the table anyway made one lake version, one raw-layer file and
one Delivery in the catalog per capture: ~525,000 of each a year for a
stream captured every minute that is idle. Instead the position is kept
here, one record a dataset, ``<lake>/_combined/positions/<source>/<dataset>.json``,
replaced by each such capture and written whole or not at all (as the
stream records, ``_streams.py``), in the lake so that a catalog rebuilt
from the lake keeps it.

A record names the newest Combined commit of the table it continues (its
last sequence and its Run), the base. It holds while that
commit is still the table's newest: a read resumes from the record's
checkpoint then, and from the newest commit's once another commit (rows,
a reset, a held gap) made the record stale. It is written before the
source is acknowledged, and only by a capture that read nothing the
table lacks, so the lake's rows are those of its checkpoint either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from combined.errors import LakeError
from combined.lake._layout import LakeLayout
from combined.lake._probe import store_failure
from combined.lake._streams import read_json, write_whole

__all__ = ["LakePositions", "commit_identity"]


class LakePositions:
    """The positions kept in the lake of ``layout`` for captures that changed no row."""

    def __init__(self, layout: LakeLayout) -> None:
        self._store = layout.store
        self._dir = layout.store.join("_combined", "positions")

    def keep(
        self,
        source: str,
        dataset: str,
        base: Mapping[str, Any],
        checkpoint: Mapping[str, Any],
        position: str | None,
    ) -> None:
        """Keep ``checkpoint`` (at ``position``) as where reads resume after ``base``.

        ``base``: the :func:`commit_identity` of the commit the capture's read
        resumed after, the table's newest.
        """
        directory = self._store.child(self._dir, source)
        path = self._store.child(directory, f"{dataset}.json")
        record = {
            "base": dict(base),
            "checkpoint": dict(checkpoint),
            "source_position": position,
        }
        try:
            write_whole(self._store, directory, path, json.dumps(record, sort_keys=True))
        except OSError as exc:
            raise store_failure(
                f"{source}.{dataset}: the position of a capture that changed no row "
                f"({path}) could not be written",
                exc,
                "the source was not acknowledged: the next capture reads from the last "
                "position kept",
            ) from None

    def resumed(
        self, source: str, dataset: str, last: Mapping[str, Any] | None
    ) -> Mapping[str, Any] | None:
        """``last`` (the table's newest Combined commit) with the position reads resume from.

        Its ``checkpoint`` and ``source_position`` are the record's while the
        record's base is ``last``; otherwise ``last`` as it is.
        """
        if last is None:
            return None
        record = self._kept(source, dataset)
        if record is None or record.get("base") != commit_identity(last):
            return last
        return {
            **last,
            "checkpoint": record["checkpoint"],
            "source_position": record.get("source_position"),
        }

    def _kept(self, source: str, dataset: str) -> dict[str, Any] | None:
        path = self._store.child(self._store.child(self._dir, source), f"{dataset}.json")
        found, record = read_json(self._store, path, f"{source}.{dataset}: the lake's position")
        if not found:
            return None
        if not isinstance(record, dict) or not isinstance(record.get("checkpoint"), dict):
            raise LakeError(
                f"{source}.{dataset}: the lake's position ({path}) is not one Combined wrote",
                hint="it was changed by another tool: restore it from a backup of the lake "
                "(deleted, reads resume from the table's newest commit, and a change stream "
                "confirmed past it needs a new snapshot)",
            )
        return record


def commit_identity(commit: Mapping[str, Any]) -> dict[str, Any]:
    """What names a table's Combined commit: its last sequence and its Run.

    Every later Combined commit of the table (rows, a reset, a held gap,
    a table made again) has another; compactions and vacuums change no
    row and are not Combined's captures.
    """
    sequence = commit.get("last_sequence")
    run_id = commit.get("run_id")
    return {
        "last_sequence": None if sequence is None else int(sequence),
        "run_id": None if run_id is None else str(run_id),
    }
