"""``combined repair`` on an empty catalog: the publications come back from the lake.

The lake's ledger (``lake/_ledger.py``) holds every publication with its
members, Runs and admissions. When the catalog holds no publication and the
ledger holds some, the project's sources and datasets are declared again and
the publications, Runs and admissions inserted; the recovery that follows
projects the datasets' lake commits (versions, Deliveries, checkpoints, MAR)
as it always does.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from combined.catalog import Catalog
from combined.catalog import _schema as t
from combined.catalog._governance import restore, restore_quarantine, restore_runs
from combined.config import Project
from combined.lake import LakeLayout
from combined.lake._ledger import Ledger


def restore_publications(
    catalog: Catalog, layout: LakeLayout, project: Project, declare: Callable[[str], None]
) -> list[str]:
    """Restore the ledger's publications into a catalog that holds none; the notes."""
    with catalog.begin() as conn:
        if conn.execute(sa.select(t.publications.c.id).limit(1)).first() is not None:
            return []
    ledger = Ledger(layout)
    records = ledger.records()
    if not records:
        return []
    for source in project.sources:
        declare(source)
    with catalog.begin() as conn:
        ended = restore_runs(conn, ledger.runs())  # as they ended: first
        publications, runs = restore(conn, records)
        held = restore_quarantine(conn, ledger.quarantine_entries())
    return [
        f"restored {publications} publication(s) and {ended + runs} run(s) with their "
        f"admissions, and {held} quarantine entr{'y' if held == 1 else 'ies'}, from the lake"
    ]
