"""``combined repair`` on an empty catalog: the publications come back from the lake.

The lake's ledger (``lake/_ledger.py``) holds every publication with its
members, Runs and admissions. When the catalog holds no publication and the
ledger holds some, the project's sources and datasets are declared again and
the publications, Runs and admissions inserted (with the quarantine entries,
and the datasets' resets: a publication made before one read the table it
forgot); the recovery that follows
projects the datasets' lake commits (versions, Deliveries, checkpoints, MAR)
as it always does.

A catalog that holds no publication is not always a lost one: a new
project's first publication may be in flight in another process (the lake,
its ledger, is written first). A catalog is taken as lost only when no Run in
it has left the queue, checked again under the publishing lock right before
the restore: a publication in flight ends before the check looks.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from combined.catalog import Catalog
from combined.catalog import _schema as t
from combined.catalog._data import one_publisher
from combined.catalog._governance import restore, restore_quarantine, restore_runs
from combined.catalog._resets import restore_resets
from combined.config import Project
from combined.lake import LakeLayout
from combined.lake._ledger import Ledger


def restore_publications(
    catalog: Catalog, layout: LakeLayout, project: Project, declare: Callable[[str], None]
) -> list[str]:
    """Restore the ledger's publications into a catalog that holds none; the notes."""
    with catalog.begin() as conn:
        if not _lost(conn):
            return []
    ledger = Ledger(layout)
    records = ledger.records()
    if not records:
        return []
    for source in project.sources:
        declare(source)
    with catalog.begin() as conn:
        one_publisher(conn)
        if not _lost(conn):
            return []
        ended = restore_runs(conn, ledger.runs())  # as they ended: first
        publications, runs = restore(conn, records)
        held = restore_quarantine(conn, ledger.quarantine_entries())
        # (a publication made before a dataset's reset read the table it forgot)
        forgot = restore_resets(conn, ledger.resets())
    resets = f", and {forgot} dataset reset(s)" if forgot else ""
    return [
        f"restored {publications} publication(s) and {ended + runs} run(s) with their "
        f"admissions, and {held} quarantine entr{'y' if held == 1 else 'ies'}{resets}, "
        "from the lake"
    ]


def _lost(conn: sa.Connection) -> bool:
    """Whether the catalog holds no publication and no Run that left the queue."""
    if conn.execute(sa.select(t.publications.c.id).limit(1)).first() is not None:
        return False
    moved = sa.select(t.runs.c.id).where(t.runs.c.state != "queued").limit(1)
    return conn.execute(moved).first() is None
