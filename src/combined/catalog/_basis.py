"""The published basis of a publication: each dataset's newest member at or before it."""

from __future__ import annotations

import sqlalchemy as sa

from combined.catalog import _schema as t


def newest_seqs(publication_seq: int) -> sa.Subquery:
    """``(source, dataset, seq)``: the number of each dataset's newest publication at or
    before publication ``publication_seq`` (the member a query of it reads)."""
    pm, p = t.publication_members, t.publications
    return (
        sa.select(pm.c.source, pm.c.dataset, sa.func.max(p.c.seq).label("seq"))
        .join(p, p.c.id == pm.c.publication_id)
        .where(p.c.seq <= publication_seq)
        .group_by(pm.c.source, pm.c.dataset)
        .subquery()
    )
