"""A table the lake lost: refused before a Run reads or writes anything of its dataset.

The catalog records, per dataset, the lake table versions it committed (and
the checkpoint of the newest); the lake holds the tables. A bucket emptied, a
prefix or a table's directory deleted, or ``lake:`` pointed elsewhere leaves
the catalog claiming versions the lake does not hold, and a capture then
found "no table" and wrote one afresh at version 0, as if it were a first
capture: the history its publications read lost, its rows' MAR billed again,
a change stream resumed from a checkpoint whose base is gone. So a Run,
under its leases and before its first read, refuses a dataset whose table is
missing while the catalog records a committed version of it
(:func:`lost_tables`): :class:`~combined.errors.TableMissing`,
``needs_review``. A person restores the lake, or records a reset
(``combined reset``, :mod:`combined.runtime._reset`), after which the next
capture is a first capture.

What counts as recorded (:func:`recorded`): the dataset's catalog row (a
lake version, a delivery sequence or a checkpoint), else a publication of
the dataset since its last reset (a catalog rebuilt from the lake's ledger
holds those before the lake's commits are projected). A dataset with
neither is new, and its first capture creates its table as it always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, resets
from combined.catalog import data as cat
from combined.errors import NotFoundError, TableMissing
from combined.lake import LakeLayout
from combined.runtime._plan import DatasetPlan, table_of

#: What may have happened to a table the catalog recorded and the lake lacks.
CAUSES = (
    "the bucket emptied, its prefix or the table's directory deleted, or `lake:` pointing elsewhere"
)


@dataclass(frozen=True)
class Recorded:
    """What the catalog records of a dataset's table: its newest version, and when."""

    lake_version: int | None
    #: When that version was committed (or published, ``published``), if known.
    at: datetime | None
    published: bool = False

    def said(self) -> str:
        """``lake version N (committed <time>)``, as an error names it."""
        version = (
            "a lake version" if self.lake_version is None else f"lake version {self.lake_version}"
        )
        if self.at is None:
            return version
        how = "published" if self.published else "committed"
        return f"{version} ({how} {self.at.isoformat(timespec='seconds')})"


def recorded(conn: Connection, source: str, dataset: str) -> Recorded | None:
    """What the catalog records of the dataset's table; None for a dataset never committed."""
    try:
        row: Any = cat.get_dataset(conn, source, dataset)
    except NotFoundError:
        row = None
    if row is not None and (
        row.lake_version is not None or row.checkpoint is not None or row.last_sequence
    ):
        told = cat.activity(
            conn, limit=1, kind="delivery.committed", source=source, dataset=dataset, exact=True
        )
        return Recorded(row.lake_version, told[0].at if told else None)
    published = resets.published_since_reset(conn, source, dataset)
    if published is None:
        return None
    return Recorded(published[0], published[1], published=True)


def lost_tables(
    catalog: Catalog, layout: LakeLayout, plans: Sequence[DatasetPlan]
) -> TableMissing | None:
    """The :class:`TableMissing` of the datasets whose table is gone though the catalog
    recorded it; None when every recorded table is in the lake.

    Called under the Run's leases, after catching up (the table's one load is
    shared with the steps that follow, so this costs no request of its own;
    a table found missing costs a listing of its source's directory, which
    must answer). Every lost table of the Run is named.
    """
    lost: list[tuple[DatasetPlan, Recorded]] = []
    for plan in plans:
        if table_of(layout, plan).pinned().exists():
            continue
        with catalog.begin() as conn:
            seen = recorded(conn, plan.source, plan.name)
        # A lake the store cannot list (a file where its directory was) is no missing
        # table: the Run's first read of it says what the store answered.
        if (
            seen is not None
            and layout.store.directories(layout.store.join(plan.source)) is not None
        ):
            lost.append((plan, seen))
    return _refusal(layout, lost) if lost else None


def _refusal(layout: LakeLayout, lost: list[tuple[DatasetPlan, Recorded]]) -> TableMissing:
    """The error naming each lost table, why the capture stops, and what to do."""
    names = [f"{p.source}.{p.name}" for p, _ in lost]
    told = "; ".join(
        f"{p.source}.{p.name}: its table at {table_of(layout, p).path} is missing from the lake, "
        f"though the catalog recorded {seen.said()}"
        for p, seen in lost
    )
    stream = any(p.strategy == "cdc" for p, _ in lost)
    return TableMissing(
        f"{told} ({CAUSES}); nothing was read or written",
        hint="writing a table afresh would lose its history (the versions its publications "
        "read), bill its rows' MAR again"
        + (", and start a change stream from a checkpoint whose base is gone" if stream else "")
        + ": restore the lake (or point `lake:` back at it) and capture again, or record a "
        f"deliberate reset, `combined reset {' '.join(names)} --reason TEXT --yes`, after which "
        "the next capture is a first capture (the raw layer, quarantine and MAR are kept)",
        datasets=names,
    )
