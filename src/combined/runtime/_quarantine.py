"""Quarantine: a capture held for review instead of delivered (schema drift, duplicate keys).

Each entry is one Parquet file under the dataset's quarantine directory,
whole or absent, registered with its reader and review due date and told
as Activity (``quarantine.added``). Nothing leaves the quarantine except by
a recorded decision (``combined quarantine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.capture._reduce import Reducer
from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.errors import DriftQuarantined, DriftRejected
from combined.lake import ROW_GROUP_ROWS, LakeLayout, parquet_writer
from combined.runtime._plan import DatasetPlan, Staged
from combined.runtime._stage import ORDINAL


def quarantine_duplicates(
    reducer: Reducer, staged: Staged, *, run_id: str, layout: LakeLayout, catalog: Catalog
) -> tuple[str, bool]:
    """Put the rows of duplicated keys in quarantine, with their ordinals.

    Returns the entry's id and whether this capture was held: while an entry
    of the same rows awaits review, another copy is not held (nothing was
    committed, so the source still has them), and that entry's id is returned.
    """
    plan = staged.plan
    rows = reducer.duplicate_rows()
    reason = f"duplicate key ({', '.join(plan.key)})"
    waiting = _waiting_with_same_rows(catalog, layout, plan, reason, rows)
    if waiting is not None:
        return waiting, False
    path = _quarantine_path(layout, plan, run_id)
    # whole or absent: never a torn file under an entry
    with layout.store.written(path) as (target, filesystem):
        pq.write_table(rows, target, filesystem=filesystem)
    qid = _register_quarantine(
        catalog, plan, run_id, path, records=rows.num_rows, reason=reason, kind="duplicate key"
    )
    return qid, True


def _waiting_with_same_rows(
    catalog: Catalog, layout: LakeLayout, plan: DatasetPlan, reason: str, rows: pa.Table
) -> str | None:
    """An undecided entry of the dataset, for ``reason``, holding the same rows (in any order)."""
    import duckdb

    with catalog.begin() as conn:
        candidates = [
            q
            for q in cat.quarantined(conn, plan.source)
            if q.dataset == plan.name
            and q.decision is None
            and q.reason == reason
            and q.record_count == rows.num_rows
        ]
    # Where a row sat in the read is not part of what it is.
    mine = rows.drop_columns([c for c in (ORDINAL,) if c in rows.column_names])
    for entry in candidates:
        try:
            held = layout.store.read_table(entry.path)
        except OSError:
            continue  # its file is gone: not the same evidence
        held = held.drop_columns([c for c in (ORDINAL,) if c in held.column_names])
        if held.schema != mine.schema:
            continue
        con = duckdb.connect()
        try:
            con.register("mine", mine)
            con.register("held", held)
            differ = con.execute(
                "SELECT (SELECT count(*) FROM (SELECT * FROM mine EXCEPT ALL SELECT * FROM held))"
                " + (SELECT count(*) FROM (SELECT * FROM held EXCEPT ALL SELECT * FROM mine))"
            ).fetchone()
        except duckdb.Error:
            continue  # rows DuckDB cannot compare: held again rather than guessed the same
        finally:
            con.close()
        if differ is not None and differ[0] == 0:
            return str(entry.id)
    return None


def quarantine_capture(
    parts: Sequence[Path],
    plan: DatasetPlan,
    *,
    run_id: str,
    reason: str,
    layout: LakeLayout,
    catalog: Catalog,
) -> str:
    """Hold a whole staged capture in quarantine (one Parquet file, streamed part by part).

    Returns the quarantine entry's id.
    """
    from combined.delivery import StagedParts, part_schema

    path = _quarantine_path(layout, plan, run_id)
    records = 0
    stream = StagedParts(list(parts), part_schema(parts[-1]))  # the last part has every field
    # Whole or absent: never a torn file under an entry (no entry names it yet).
    with (
        layout.store.written(path) as (target, filesystem),
        parquet_writer(target, stream.schema, filesystem=filesystem) as writer,
    ):
        for batch in stream.batches():
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
            records += batch.num_rows
    return _register_quarantine(
        catalog, plan, run_id, path, records=records, reason=reason, kind="schema drift"
    )


def _quarantine_path(layout: LakeLayout, plan: DatasetPlan, run_id: str) -> str:
    qdir = layout.quarantine(plan.source, plan.name)
    layout.store.makedirs(qdir)
    return layout.store.child(qdir, f"q-{run_id}-{plan.name}.parquet")


def _register_quarantine(
    catalog: Catalog,
    plan: DatasetPlan,
    run_id: str,
    path: str,
    *,
    records: int,
    reason: str,
    kind: str,
) -> str:
    """Record a quarantined file with its reader and review due date; returns its id."""
    from combined.protocol import utcnow

    qid = Path(path).stem
    with catalog.begin() as conn:
        cat.add_quarantine(
            conn,
            id=qid,
            source=plan.source,
            dataset=plan.name,
            run_id=run_id,
            delivery_id=None,
            reason=reason,
            path=str(path),
            record_count=records,
            reader=plan.quarantine_reader,
            review_due_at=utcnow() + timedelta(seconds=plan.review_every_s),
        )
        cat.emit(
            conn,
            "quarantine.added",
            source=plan.source,
            dataset=plan.name,
            run_id=run_id,
            quarantine=qid,
            records=records,
            reason=kind,
            path=str(path),
        )
    return qid


def drift_held(
    catalog: Catalog, layout: LakeLayout, run_id: str, plan: DatasetPlan, exc: DriftRejected
) -> DriftRejected:
    """Record a capture's drift held back by its policy; quarantine holds the capture.

    Every drift event is written to the Activity feed with its outcome,
    whatever it is. A ``quarantine`` outcome (and no ``fail``) keeps the
    whole capture in quarantine for review before the staging goes; the
    error returned (to raise) names the quarantine entry.
    """
    with catalog.begin() as conn:
        for event in exc.drift:
            cat.emit(conn, "drift", source=plan.source, dataset=plan.name, run_id=run_id, **event)
    if not isinstance(exc, DriftQuarantined) or not exc.parts:
        return exc
    held = [e for e in exc.drift if e["outcome"] == "quarantine"]
    reason = "schema drift: " + ", ".join(f"{e['class']} {e['field']!r}" for e in held)
    with catalog.begin() as conn:
        waiting = [
            q.id
            for q in cat.quarantined(conn, plan.source)
            if q.dataset == plan.name and q.decision is None and q.reason == reason
        ]
    if waiting:
        # The same drift already awaits review: the source still holds
        # these rows (nothing was committed, no checkpoint moved), so a
        # second copy would only grow the quarantine area at every capture.
        message = (
            f"{exc.what}; nothing was committed, and the same drift awaits review in "
            f"quarantine entry {waiting[0]}, so this capture was not held again"
        )
    else:
        qid = quarantine_capture(
            exc.parts,
            plan,
            run_id=run_id,
            reason=reason,
            layout=layout,
            catalog=catalog,
        )
        message = f"{exc.message} (entry {qid})"
    named = DriftQuarantined(message, hint=exc.hint)
    named.drift, named.parts, named.what = exc.drift, exc.parts, exc.what
    return named
