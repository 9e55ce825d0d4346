"""Recorded resets of a dataset: the lake table versions the catalog forgot, and when.

A reset (``combined reset``, ``runtime._reset``) forgets what the catalog
recorded of a dataset's table (its lake versions, sequences, dataset version
and checkpoint): the next capture is a first capture and makes a new table.
Publications made before it keep their members, which name versions of the
table it forgot: ``after_seq`` is the newest publication's number when the
reset was made, and a member of the dataset published up to it is not read
as a version of the new table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _schema as t
from combined.catalog._basis import newest_seqs

#: A reset's ``state`` in the lake's ledger: decided and recorded, maybe with tables still
#: to remove and the catalog not yet told; then done (a record without one is done).
BEGUN, DONE = "begun", "done"


def record_reset(conn: Connection, **values: Any) -> None:
    """Insert one reset (``id``, ``source``, ``dataset``, ``at``, ``by``, ``reason``,
    ``after_seq``, ``forgotten``)."""
    conn.execute(t.dataset_resets.insert().values(**values))


def newest_publication_seq(conn: Connection) -> int:
    """The number of the newest publication (0 before the first)."""
    return int(conn.execute(sa.select(sa.func.max(t.publications.c.seq))).scalar() or 0)


def reset_after_seq(conn: Connection, reset_id: str) -> int | None:
    """The newest publication's number when reset ``reset_id`` was recorded; None when the
    catalog has no such reset."""
    r = t.dataset_resets
    found = conn.execute(sa.select(r.c.after_seq).where(r.c.id == reset_id)).first()
    return None if found is None else int(found.after_seq)


def reset_seq(conn: Connection, source: str, dataset: str) -> int:
    """The newest publication's number at the dataset's last reset (0: never reset)."""
    r = t.dataset_resets
    found = conn.execute(
        sa.select(sa.func.max(r.c.after_seq)).where(r.c.source == source, r.c.dataset == dataset)
    ).scalar()
    return int(found or 0)


def resets(conn: Connection, source: str | None = None) -> list[sa.Row[Any]]:
    """Every reset (of ``source``'s datasets), oldest first."""
    q = sa.select(t.dataset_resets).order_by(t.dataset_resets.c.at)
    if source is not None:
        q = q.where(t.dataset_resets.c.source == source)
    return list(conn.execute(q))


def published_since_reset(
    conn: Connection, source: str, dataset: str
) -> tuple[int, datetime] | None:
    """The lake version and time of the dataset's newest publication since its last reset."""
    pm, p = t.publication_members, t.publications
    row = conn.execute(
        sa.select(pm.c.lake_version, p.c.published_at)
        .join(p, p.c.id == pm.c.publication_id)
        .where(
            pm.c.source == source,
            pm.c.dataset == dataset,
            pm.c.lake_version.is_not(None),
            p.c.seq > reset_seq(conn, source, dataset),
        )
        .order_by(p.c.seq.desc())
        .limit(1)
    ).first()
    return None if row is None else (int(row.lake_version), row.published_at)


def forgotten_members(conn: Connection, publication_seq: int) -> dict[tuple[str, str], sa.Row[Any]]:
    """The datasets whose member in the basis of publication ``publication_seq`` reads a
    table a later reset forgot, each with the newest such reset."""
    r = t.dataset_resets
    newest = newest_seqs(publication_seq)
    rows = conn.execute(
        sa.select(r)
        .join(
            newest,
            sa.and_(
                newest.c.source == r.c.source,
                newest.c.dataset == r.c.dataset,
                r.c.after_seq >= newest.c.seq,
            ),
        )
        .order_by(r.c.at)
    )
    return {(row.source, row.dataset): row for row in rows}


def restore_resets(conn: Connection, records: Sequence[Mapping[str, Any]]) -> int:
    """Insert the ledger's resets the catalog lacks; how many.

    A reset the ledger holds as begun (``state``) was stopped part way, maybe
    before its tables were removed: it is no reset yet, and the same
    ``combined reset`` finishes it.
    """
    added = 0
    for rec in records:
        if rec.get("state") == BEGUN:
            continue
        if conn.execute(
            sa.select(t.dataset_resets.c.id).where(t.dataset_resets.c.id == rec["id"])
        ).first():
            continue
        columns = {c.name for c in t.dataset_resets.columns}
        values = {k: v for k, v in rec.items() if k in columns}
        values["at"] = datetime.fromisoformat(str(values["at"]))
        conn.execute(t.dataset_resets.insert().values(**values))
        added += 1
    return added
