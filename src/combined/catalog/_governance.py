"""A publication's governance record for the lake's ledger, and its restoration.

The record says what was published, when, from which Runs under which
admissions: the publication row, its members, and each Run with its
admission. :func:`record` builds it inside the publishing transaction (the
ledger writes it to the lake before that transaction commits);
:func:`restore` puts records back into an empty catalog (``combined repair``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _schema as t

_MEMBER = (
    "source",
    "dataset",
    "dataset_version",
    "lake_version",
    "source_position",
    "extraction_receipt",
    "committed_at",
    "changed",
)


def jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def run_record(conn: Connection, run_id: str) -> dict[str, Any] | None:
    """A Run as it now is, with the admission it executes under (None: no such Run)."""
    run = conn.execute(sa.select(t.runs).where(t.runs.c.id == run_id)).first()
    if run is None:
        return None
    admission = conn.execute(
        sa.select(t.admissions).where(t.admissions.c.id == run.admission_id)
    ).one()
    return {"run": jsonable(dict(run._mapping)), "admission": jsonable(dict(admission._mapping))}


def _with_admission(conn: Connection, entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The entry's Run as insert values, its admission inserted if missing; None: Run known."""
    admission = _values(t.admissions, entry["admission"])
    if not conn.execute(
        sa.select(t.admissions.c.id).where(t.admissions.c.id == admission["id"])
    ).first():
        conn.execute(t.admissions.insert().values(**admission))
    run = _values(t.runs, entry["run"])
    if conn.execute(sa.select(t.runs.c.id).where(t.runs.c.id == run["id"])).first():
        return None
    return run


def restore_runs(conn: Connection, entries: Sequence[Mapping[str, Any]]) -> int:
    """Insert the ended Runs (and their admissions) the catalog lacks; how many."""
    added = 0
    for entry in entries:
        run = _with_admission(conn, entry)
        if run is None:
            continue
        conn.execute(t.runs.insert().values(**run))
        added += 1
    return added


def record(
    conn: Connection,
    publication: Mapping[str, Any],
    members: Sequence[Any],
    runs: Sequence[str],
) -> dict[str, Any]:
    """The ledger record of a publication being inserted (its row, members, Runs, admissions)."""
    out = [r for r in map(lambda run_id: run_record(conn, run_id), runs) if r is not None]
    return {
        **jsonable(publication),
        "members": [jsonable({k: getattr(m, k) for k in _MEMBER}) for m in members],
        "runs": out,
    }


def _values(table: sa.Table, row: Mapping[str, Any]) -> dict[str, Any]:
    """A record's row as insert values: known columns only, instants parsed."""
    values = {}
    for column in table.columns:
        if column.name not in row:
            continue
        value = row[column.name]
        if isinstance(value, str) and isinstance(column.type, t.UTCDateTime):
            value = datetime.fromisoformat(value)
        values[column.name] = value
    return values


def restore(conn: Connection, records: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """Insert the records' admissions, Runs, publications and members; (publications, Runs).

    A published Run succeeded (its state moved in the publishing transaction).
    """
    runs = 0
    for rec in records:
        for entry in rec["runs"]:
            run = _with_admission(conn, entry)
            if run is None:
                # (a capture's held publication names its Runs after they ended)
                conn.execute(
                    t.runs.update()
                    .where(t.runs.c.id == entry["run"]["id"], t.runs.c.publication_id.is_(None))
                    .values(publication_id=rec["id"])
                )
                continue
            run.update(state="succeeded", publication_id=rec["id"])
            conn.execute(t.runs.insert().values(**run))
            runs += 1
        conn.execute(t.publications.insert().values(**_values(t.publications, rec)))
        for m in rec["members"]:
            values = _values(t.publication_members, m)
            conn.execute(t.publication_members.insert().values(publication_id=rec["id"], **values))
            conn.execute(
                t.datasets.update()
                .where(t.datasets.c.source == m["source"], t.datasets.c.name == m["dataset"])
                .values(published_at=datetime.fromisoformat(rec["published_at"]))
            )
    return len(records), runs


def restore_quarantine(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert the quarantine entries the catalog lacks (each as it last was); how many."""
    added = 0
    for row in rows:
        if conn.execute(sa.select(t.quarantine.c.id).where(t.quarantine.c.id == row["id"])).first():
            continue
        conn.execute(t.quarantine.insert().values(**_values(t.quarantine, row)))
        added += 1
    return added
