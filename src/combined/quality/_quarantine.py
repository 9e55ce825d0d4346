"""Quarantine review: who reads it, when it is due, and the decisions that close it.

A capture puts records it cannot commit (the rows of a duplicated key) in
the lake's quarantine area and registers them in the catalog with the
dataset's named reader and a review due date. From then on:

- an entry whose review is due and still undecided raises an
  ``alert.quarantine_overdue`` Activity event, once per review period (the
  next reminder is due one period later);
- a reviewer closes it by an explicit, recorded decision, with their name
  and a reason: ``released`` (reviewed; the records stay in quarantine as
  evidence) or ``discarded`` (reviewed; the records' file is deleted).
  A released entry may still be discarded later; a discarded one is final.

Nothing is deleted from quarantine except by a ``discarded`` decision, and
the decision is recorded before the file goes: a crash in between leaves a
file whose entry already says it was discarded, never a file gone unrecorded.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from combined._credentials import redact
from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.errors import ConfigError, LakeError, ProtocolViolation
from combined.lake import LakeLayout
from combined.protocol import utcnow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["decide", "entries", "records", "remind"]

#: The review period of an entry whose dataset is no longer declared.
DEFAULT_REVIEW_EVERY = timedelta(days=7)


def entries(
    catalog: Catalog, *, source: str | None = None, include_decided: bool = False
) -> list[dict[str, Any]]:
    """Quarantine entries, newest first: those awaiting a decision, or every one."""
    now = utcnow()
    with catalog.begin() as conn:
        rows = cat.quarantined(conn, source)
    out = []
    for row in rows:
        entry = dict(row._mapping)
        if include_decided or entry["decision"] is None:
            entry["overdue"] = entry["decision"] is None and entry["review_due_at"] <= now
            out.append(entry)
    return out


def records(
    catalog: Catalog, layout: LakeLayout, quarantine_id: str, limit: int, offset: int = 0
) -> tuple[dict[str, Any], pa.Table]:
    """An entry and ``limit`` of its records from ``offset`` on (all from there for 0).

    Only the rows asked for are held: row groups before ``offset`` are not
    read at all, and reading stops once ``limit`` rows are taken.
    """
    if limit < 0:
        raise ConfigError(f"--limit must be 0 or more, not {limit}", hint="e.g. --limit 20")
    if offset < 0:
        raise ConfigError(f"the offset must be 0 or more, not {offset}", hint="start at 0")
    with catalog.begin() as conn:
        entry = dict(cat.get_quarantine(conn, quarantine_id)._mapping)
    path = _file(layout, entry)
    if not layout.store.exists(path):
        if entry["decision"] == "discarded":
            raise ProtocolViolation(
                f"quarantine entry {quarantine_id} was discarded by {entry['decided_by']} "
                f"at {entry['decided_at']:%Y-%m-%d %H:%M:%S}: its records are gone",
                hint="the decision and its reason are in the activity feed",
            )
        raise LakeError(
            f"the records of quarantine entry {quarantine_id} are missing ({path})",
            hint="restore the file from a backup; nothing discarded it",
        )
    return entry, _rows(layout.store.open_input(path), limit, offset)


def _rows(source: Any, limit: int, offset: int) -> pa.Table:
    """Rows ``offset`` to ``offset + limit`` of a Parquet file (to its end for ``limit`` 0).

    ``source`` is the file opened for reading, on a local disk or in the store.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(source) as file:
        groups = list(range(file.num_row_groups))
        while groups and offset >= (n := file.metadata.row_group(groups[0]).num_rows):
            offset -= n  # a whole row group before the page: not read
            groups.pop(0)
        batches: list[pa.RecordBatch] = []
        taken = 0
        for batch in file.iter_batches(batch_size=limit or 65_536, row_groups=groups):
            skipped = min(offset, batch.num_rows)
            offset -= skipped
            page = batch.slice(skipped, (limit - taken) if limit else None)
            batches.append(page)
            taken += page.num_rows
            if limit and taken >= limit:
                break
        return pa.Table.from_batches(batches, schema=file.schema_arrow)


def decide(
    catalog: Catalog,
    layout: LakeLayout,
    quarantine_id: str,
    decision: str,
    *,
    by: str,
    reason: str,
) -> dict[str, Any]:
    """Record a reviewer's decision on an entry; a discard then deletes its records."""
    if decision not in cat.QUARANTINE_DECISIONS:
        raise ConfigError(
            f"a quarantine decision is one of {', '.join(cat.QUARANTINE_DECISIONS)}, "
            f"not {decision!r}",
            hint="release keeps the records as evidence; discard deletes them",
        )
    # (the reviewer's name is kept in the catalog and the lake's ledger, and shown:
    # masked as the Activity event masks both, a credential pasted into --by)
    by, reason = redact(by.strip()), reason.strip()
    if not by or not reason:
        raise ConfigError(
            "a quarantine decision records who took it and why",
            hint='give --by NAME and --reason "..." (both non-empty)',
        )
    with catalog.begin() as conn:
        entry = dict(cat.get_quarantine(conn, quarantine_id)._mapping)
        before = entry["decision"]
        if before == "discarded" or before == decision:
            raise ProtocolViolation(
                f"quarantine entry {quarantine_id} was already {before} by "
                f"{entry['decided_by']} at {entry['decided_at']:%Y-%m-%d %H:%M:%S}",
                hint="its decision is recorded; `combined quarantine list --all` shows it",
            )
        path = _file(layout, entry)
        if not cat.decide_quarantine(conn, quarantine_id, decision, by=by, before=before):
            raise ProtocolViolation(
                f"quarantine entry {quarantine_id} was decided by someone else meanwhile",
                hint="`combined quarantine list --all` shows the decision",
            )
        cat.emit(
            conn,
            f"quarantine.{decision}",
            source=entry["source"],
            dataset=entry["dataset"],
            run_id=entry["run_id"],
            quarantine=quarantine_id,
            by=by,
            reason=reason,
            reader=entry["reader"],
            records=entry["record_count"],
            path=entry["path"],
            previous=before,
        )
    if decision == "discarded":
        layout.store.delete(path)
    with catalog.begin() as conn:
        return dict(cat.get_quarantine(conn, quarantine_id)._mapping)


def remind(
    catalog: Catalog,
    review_every: Callable[[str, str], timedelta | None],
    now: datetime | None = None,
) -> list[str]:
    """Raise ``alert.quarantine_overdue`` for each undecided entry whose review is due.

    Each alert moves the entry's next review one period on (the dataset's
    ``quarantine.review_every``, or a week for a dataset no longer declared),
    so an ignored entry is recalled once a period, not on every capture.
    Returns one line per alert.
    """
    now = now or utcnow()
    notes = []
    with catalog.begin() as conn:
        due = cat.overdue_quarantine(conn, now)
    for entry in due:
        every = review_every(entry.source, entry.dataset) or DEFAULT_REVIEW_EVERY
        # (the summary a person reads, all a Slack target gets: who is to review what)
        why = (
            f"quarantine {entry.id} ({entry.record_count} records) awaits review by "
            f"{entry.reader} since {entry.review_due_at:%Y-%m-%d}"
            + (f": {entry.reason}" if entry.reason else "")
        )
        with catalog.begin() as conn:
            if not cat.postpone_review(conn, entry.id, was=entry.review_due_at, until=now + every):
                continue  # another process reminded (or decided) first
            cat.emit(
                conn,
                "alert.quarantine_overdue",
                source=entry.source,
                dataset=entry.dataset,
                run_id=entry.run_id,
                quarantine=entry.id,
                reader=entry.reader,
                records=entry.record_count,
                due=entry.review_due_at.isoformat(),
                reason=entry.reason,
                why=why,
            )
        notes.append(
            f"quarantine {entry.id} ({entry.source}.{entry.dataset}, {entry.record_count} "
            f"records) awaits review by {entry.reader} since {entry.review_due_at:%Y-%m-%d}"
        )
    return notes


def _file(layout: LakeLayout, entry: dict[str, Any]) -> str:
    """The entry's records file, which must lie in the dataset's quarantine area."""
    path, area = str(entry["path"]), layout.quarantine(entry["source"], entry["dataset"])
    if layout.store.remote:
        inside = path.startswith(area + "/") and ".." not in path.split("/")
    else:
        inside = Path(path).is_absolute() and Path(path).resolve().is_relative_to(
            Path(area).resolve()
        )
    if not inside:
        raise LakeError(
            f"quarantine entry {entry['id']} names {path}, outside its quarantine area {area}",
            hint="the catalog entry was altered; restore it before deciding",
        )
    return path
