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

A lake (or a table's directory) restored from a copy taken before the last
capture holds the table at a version older than the catalog's lake
version: a capture wrote over it as if nothing happened, building on rows
older than the catalog's and taking again the versions earlier
publications read. It is refused the same way
(:class:`~combined.errors.TableBehind`), until the newer copy is restored
or a reset removes the table (``--drop-table``). The Run caught the catalog up with the lake first,
so a catalog ahead of its table is never one behind a commit.

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
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, resets
from combined.catalog import data as cat
from combined.errors import NotFoundError, TableBehind, TableMissing
from combined.lake import LakeLayout


class Declared(Protocol):
    """What the check needs of a dataset: a Run's plan, or its declaration."""

    @property
    def source(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def strategy(self) -> str: ...


@dataclass(frozen=True)
class DeclaredDataset:
    """A dataset as the project file declares it (``combined check``)."""

    source: str
    name: str
    strategy: str


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
    catalog: Catalog, layout: LakeLayout, plans: Sequence[Declared]
) -> TableMissing | None:
    """The :class:`TableMissing` of the datasets whose table is gone though the catalog
    recorded it, or (:class:`TableBehind`) is at an older version than the catalog
    recorded; None when every recorded table is in the lake, as new as recorded.

    Called under the Run's leases, after catching up (the table's one load is
    shared with the steps that follow, so this costs no request of its own:
    its version is the newest entry of the table's log, no data file is
    read; a table found missing costs a listing of its source's directory,
    which must answer). Every lost table of the Run is named.
    """
    lost: list[tuple[Declared, Recorded]] = []
    behind: list[tuple[Declared, Recorded, int]] = []
    for plan in plans:
        found = layout.dataset_table(plan.source, plan.name).pinned().version()
        if found is not None:
            seen = _newer_than(catalog, plan, found)
            if seen is not None:
                behind.append((plan, seen, found))
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
    if lost:
        return _refusal(layout, lost)
    return _behind(layout, behind) if behind else None


def _newer_than(catalog: Catalog, plan: Declared, found: int) -> Recorded | None:
    """What the catalog records of the dataset's table when it is a lake version newer
    than ``found``, the table's; None when the table is as new as recorded."""
    with catalog.begin() as conn:
        try:
            committed = cat.get_dataset(conn, plan.source, plan.name).lake_version
        except NotFoundError:
            return None
        # (the catalog's lake version is caught up with the lake's: never ahead but here)
        if committed is None or int(committed) <= found:
            return None
        return recorded(conn, plan.source, plan.name)


def _refusal(layout: LakeLayout, lost: list[tuple[Declared, Recorded]]) -> TableMissing:
    """The error naming each lost table, why the capture stops, and what to do."""
    names = [f"{p.source}.{p.name}" for p, _ in lost]
    told = "; ".join(
        f"{p.source}.{p.name}: its table at {layout.table(p.source, p.name)} is missing from "
        f"the lake, though the catalog recorded {seen.said()}"
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


def _behind(layout: LakeLayout, behind: list[tuple[Declared, Recorded, int]]) -> TableBehind:
    """The error naming each table older than the catalog records, and what to do."""
    names = [f"{p.source}.{p.name}" for p, _, _ in behind]
    told = "; ".join(
        f"{p.source}.{p.name}: its table at {layout.table(p.source, p.name)} is at lake version "
        f"{found}, behind {seen.said()} the catalog recorded"
        for p, seen, found in behind
    )
    stream = any(p.strategy == "cdc" for p, _, _ in behind)
    return TableBehind(
        f"{told} (the lake, or the table's directory, restored from an older copy); nothing "
        "was read or written",
        hint="capturing over it would build on rows older than the catalog's, take again "
        "the versions its publications read"
        + (", and resume a change stream past changes the table lacks" if stream else "")
        + ": restore the newer copy of the table (taken after the version the catalog "
        "recorded) and capture again, or record a deliberate reset that removes it, "
        f"`combined reset {' '.join(names)} --reason TEXT --drop-table --yes`, after which the "
        "next capture is a first capture (the raw layer, quarantine and MAR are kept)",
        datasets=names,
    )
