"""Prepare one dataset's capture for commit: reduce it, write its Deliveries.

The reduction compares the staged capture with the lake's current state
(``combined.capture._reduce``); the transition it yields is written as
bounded Delivery files and described by the lake commit's metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from combined.capture._reduce import Reducer, Transition
from combined.catalog import Catalog, VersionTotals, version_id
from combined.catalog import data as cat
from combined.delivery import StagedDelivery, StagingArea, write_deliveries
from combined.errors import DeliveryAltered, DuplicateKeys, LakeError, NotFoundError
from combined.lake import (
    ROW_GROUP_ROWS,
    LakeLayout,
    lake_schema,
    parquet_writer,
    to_lake,
)
from combined.protocol import _provenance as prov
from combined.protocol._digest import Digest, digest_of
from combined.runtime._memory import release_memory
from combined.runtime._pipeline import DatasetPlan, Prepared, Staged, commit_schema_fields, table_of
from combined.runtime._reporter import Reporter
from combined.runtime._stager import ORDINAL


def _count_live(staged: Staged, reducer: Reducer) -> None:
    """A whole (or bounded) capture's source counts less its flagged rows: the live rows.

    Reconciliation compares the source's rows (and control totals, read in
    the same snapshot) with the lake's, which holds no row a soft-delete flag marks.
    """
    control = staged.control
    column = control.get("sum_column") if control else None
    rows, total = reducer.flagged(column)
    if not rows:
        return
    staged.rows -= rows
    if control is not None:
        live = {**control, "rows": int(control["rows"]) - rows}
        if column and control.get("sum") is not None and total is not None:
            live["sum"] = str(Decimal(str(control["sum"])) - Decimal(str(total)))
        staged.control = live


def prepare(
    staged: Staged,
    *,
    run_id: str,
    admission_id: str,
    producer: str,
    area: StagingArea,
    layout: LakeLayout,
    memory_limit: int,
    catalog: Catalog,
    reporter: Reporter,
) -> Prepared:
    """Reduce the staged capture to its transition and write it as Deliveries."""
    plan = staged.plan
    table = table_of(layout, plan)
    current_files = table.files() if plan.sync_mode != "append" else []
    baseline = not table.exists()
    spill = area.path(f"{plan.source}/{plan.name}/spill/.keep").parent
    reporter.phase(plan.name, "reducing")
    # The acceptance time: the engine accepted the transition for commit. It is
    # stamped on the Delivery rows and recorded in the lake commit's metadata.
    accepted_at = datetime.now(UTC)
    row = _dataset_row(catalog, plan)
    digest = _digest(plan, table.schema(), staged.schema)
    reducer = Reducer(
        capture_files=staged.parts,
        capture_schema=staged.schema,
        current_files=current_files,
        key=plan.key,
        strategy=plan.strategy,
        sync_mode=plan.sync_mode,
        memory_limit=memory_limit,
        spill_dir=spill,
        baseline=baseline,
        full=staged.full,
        current_filter=staged.current_filter,
        lake=layout.store,
        digest=digest,
        deletes=plan.deletes,
        dataset=f"{plan.source}.{plan.name}",
    )
    # At most one task beside this thread (a first baseline's digests and change list).
    side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transition")
    pending: Future[Transition] | None = None
    try:
        if reducer.duplicates(limit=1):
            qid, held = quarantine_duplicates(
                reducer, staged, run_id=run_id, layout=layout, catalog=catalog
            )
            try:
                reducer.check_duplicates(f"{plan.source}.{plan.name}")
            except DuplicateKeys as exc:
                where = (
                    f"its rows are held in quarantine entry {qid}"
                    if held
                    else f"the same rows already await review in quarantine entry {qid}, "
                    "so this capture was not held again"
                )
                raise DuplicateKeys(
                    f"{exc.message}; {where}",
                    hint="fix the key in the source or declare a key that is unique "
                    f"(`combined quarantine show {qid}` lists the rows)",
                    **exc.context,
                ) from None
        # A first baseline's counts are known from its staged parts; its
        # digests follow on a second connection while its Deliveries are
        # encoded (neither needs the other).
        transition = reducer.counts_all_new() if reducer.all_new else reducer.reduce()
        if reducer.soft is not None and (staged.full or staged.bounded) and not reducer.has_op:
            _count_live(staged, reducer)
        first_seq = table.committed_sequence() + 1
        payload = [
            f for f in staged.schema if not f.name.startswith("_combined_") and f.name != ORDINAL
        ]
        schema = lake_schema(pa.schema(payload))
        for pf in prov.provenance_fields(digest):
            schema = schema.append(pf)
        deliveries: list[StagedDelivery] = []
        changes_path: Path | None = None
        # A change stream that moved without touching this dataset still commits
        # its position (an empty Delivery), so the slot can be confirmed past it.
        # A first capture creates the table even when the source is empty, so
        # the dataset is queryable (and empty) once published.
        # A column the drift policy let the table evolve to is published even
        # while every row holds null there (no row changed): an empty Delivery
        # carries the widened schema. So is a column whose type widened.
        committed = table.schema()
        grown = committed is not None and (
            any(f.name not in committed.names for f in payload)
            or any(e["class"] == "widened_type" for e in staged.drift)
        )
        # A replacement follows the source's columns: one it no longer has
        # leaves the table, even where it held only nulls (which no row's
        # payload hash tells apart from an absent column).
        names = {f.name for f in payload}
        shrunk = (
            plan.sync_mode == "full_refresh"
            and committed is not None
            and any(not n.startswith("_combined_") and n not in names for n in committed.names)
        )
        moved = (
            baseline
            or grown
            or shrunk
            or (
                plan.strategy == "cdc"
                and staged.state is not None
                and dict(staged.state) != dict(staged.prior_state or {})
            )
        )
        # A replacement that changes no row is not written: the projection
        # already holds every row it would deliver, and another copy of the
        # table in the lake and the raw layer would record nothing new.
        if transition.changes or moved:
            observed = staged.receipt.snapshot_acquired_at or staged.receipt.extraction_started_at
            constants = {
                "observed_at": (observed or accepted_at).isoformat(),
                # The Deliveries are final: their rows become the table's rows as they are.
                "ingested_at": accepted_at.isoformat(),
                "run_id": run_id,
                "producer": producer,
                "position": staged.position,
            }
            if plan.sync_mode == "full_refresh":
                # A replacement delivers every row, changed or not: MAR needs
                # the list of the ones that changed. Any other transition
                # delivers exactly its changes, and MAR reads their ids there.
                changes_path = area.path(
                    f"{plan.source}/{plan.name}/deliveries/{first_seq:09d}-transition.parquet"
                )
                _write_changes(reducer.changes(), changes_path, area)
            elif reducer.all_new:
                pending = side.submit(_digests, reducer)
            reducer.release()  # what the Deliveries no longer need, before they are encoded
            batches = (to_lake(b, schema) for b in reducer.output(constants))
            deliveries = write_deliveries(
                area,
                batches,
                run_id=run_id,
                source=plan.source,
                dataset=plan.name,
                first_sequence=first_seq,
                schema=schema,
                schema_revision=_schema_revision(row, schema),
                max_rows=plan.max_rows,
                max_bytes=plan.max_bytes,
                allow_empty=moved or plan.sync_mode == "full_refresh",
            )
            reporter.progress(plan.name, staged.rows, 0, len(deliveries))
        if reducer.all_new:
            transition = pending.result() if pending is not None else reducer.reduce()
        if plan.sync_mode == "full_refresh":
            content = reducer.full_content_xor()
        else:
            content = None
    finally:
        side.shutdown(wait=True)  # before its connection closes, whatever failed
        reducer.close()
        # Give the batches' buffers back before the commit allocates its own.
        release_memory()
    return _finish_prepare(
        staged,
        transition,
        deliveries,
        changes_path,
        content,
        run_id,
        admission_id,
        catalog,
        row,
        baseline,
        accepted_at,
    )


def _write_changes(changes: pa.RecordBatchReader, path: Path, area: StagingArea) -> None:
    """The transition's change list (id, op): the identities MAR bills."""
    with parquet_writer(path, changes.schema) as writer:
        for batch in changes:
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
    area.account(path.stat().st_size, files=1)


def _digests(reducer: Reducer) -> Transition:
    """A first baseline's transition, on a cursor of its reduction."""
    con = reducer.cursor()
    try:
        # The two Delivery writers keep both cores busy meanwhile: one DuckDB
        # thread beside them takes as long as two, with one scan's buffers
        # (~13 MB less at the phase's peak, seven runs each). The setting is
        # the database's; the reduction runs nothing else in this phase.
        con.execute("SET threads = 1")
        return reducer.reduce(con)
    finally:
        con.close()


def _digest(plan: DatasetPlan, lake: pa.Schema | None, staged: pa.Schema) -> Digest:
    """The digest format of the dataset's table (v1 hex or v2 binary), as staging used it.

    A table keeps the format it was created with; staging read it from the
    same table when the capture began. A table created or replaced in
    between with the other format is refused, never written in two formats.
    """
    digest = digest_of(lake)
    if prov.ID in staged.names and digest_of(staged) != digest:
        raise LakeError(
            f"{plan.source}.{plan.name}: the lake table's identity encoding changed during "
            "the capture (another writer created or replaced it); nothing was committed",
            hint="capture again",
        )
    return digest


def _dataset_row(catalog: Catalog, plan: DatasetPlan) -> Any | None:
    """The dataset's catalog row (None before its first capture registers it).

    Read once per prepare: the dataset's lease keeps every other writer of it
    away until the commit, so neither its schema nor its version moves meanwhile.
    """
    with catalog.begin() as conn:
        try:
            return cat.get_dataset(conn, plan.source, plan.name)
        except NotFoundError:
            return None


def _schema_revision(row: Any | None, schema: pa.Schema) -> int:
    if row is None:
        return 1
    fields = [[f.name, str(f.type)] for f in schema]
    if row.schema is None:
        return 1
    if row.schema == fields:
        return int(row.schema_revision or 1)
    return int(row.schema_revision or 0) + 1


def _finish_prepare(
    staged: Staged,
    transition: Transition,
    deliveries: list[StagedDelivery],
    changes_path: Path | None,
    content: tuple[int, int] | None,
    run_id: str,
    admission_id: str,
    catalog: Catalog,
    row: Any | None,
    baseline: bool,
    accepted_at: datetime,
) -> Prepared:
    plan = staged.plan
    parent_id = row.current_version if row is not None else None
    with catalog.begin() as conn:
        parent = cat.get_version(conn, parent_id) if parent_id else None
    parent_count = int(parent.row_count) if parent is not None else 0
    parent_lo, parent_hi = _split(parent.content_digest if parent is not None else None)
    if content is not None:
        lo, hi = content
        row_count = transition.captured
    else:
        lo = parent_lo ^ transition.content_xor[0]
        hi = parent_hi ^ transition.content_xor[1]
        row_count = parent_count + transition.inserts - transition.deletes
        if plan.sync_mode == "append":
            row_count = parent_count + transition.captured  # every event is kept
    totals = VersionTotals(row_count=row_count, content_digest=f"{hi:016x}{lo:016x}")
    changed = bool(deliveries) and (transition.changes > 0 or content is not None)
    if content is not None and transition.changes == 0 and parent is not None:
        changed = False
    vid = (
        version_id(f"{plan.source}.{plan.name}", parent_id, transition.digest, totals)
        if changed
        else parent_id
    )
    first = deliveries[0].sequence if deliveries else 0
    last = deliveries[-1].sequence if deliveries else 0
    metadata: dict[str, Any] = {
        "dataset": f"{plan.source}.{plan.name}",
        "run_id": run_id,
        "admission_id": admission_id,
        "first_sequence": first,
        "last_sequence": last,
        "deliveries": [
            {
                "id": d.id,
                "sequence": d.sequence,
                "records": d.record_count,
                "bytes": d.byte_count,
                "content_hash": d.content_hash,
                "schema_revision": d.schema_revision,
                "file": d.path.name,
            }
            for d in deliveries
        ],
        "changes_file": changes_path.name if changes_path else None,
        # Without a change list, the Deliveries hold exactly the changes (MAR
        # reads their ids); a full refresh delivers unchanged rows too.
        "changes_from": "file" if changes_path else "deliveries",
        # A keyed transition changes each identity once; an event stream may repeat one.
        "changes_unique": plan.sync_mode != "append",
        "source_position": staged.position,
        "checkpoint": dict(staged.state) if staged.state is not None else None,
        "extraction_receipt": staged.receipt.to_json(),
        "transition": {
            "inserts": transition.inserts,
            "updates": transition.updates,
            "deletes": transition.deletes,
            "unchanged": transition.unchanged,
            "captured": transition.captured,
            "digest": transition.digest,
        },
        "version": {
            "id": vid,
            "parent": parent_id,
            "row_count": totals.row_count,
            "content_digest": totals.content_digest,
        },
        "drift": staged.drift,
        "fields": dict(staged.fields) if staged.fields else None,
        "schema": commit_schema_fields(deliveries[0].path) if deliveries else None,
        "ingested_at": accepted_at.isoformat(),
    }
    if plan.history:
        # Its projection keeps the versions too (``lake/_history.py``).
        metadata["history"] = True
    mode = {"incremental": "merge", "append": "append", "full_refresh": "overwrite"}[plan.sync_mode]
    needs_merge = not baseline and (transition.updates > 0 or transition.deletes > 0)
    return Prepared(
        staged=staged,
        transition=transition,
        deliveries=deliveries,
        changes_path=changes_path,
        metadata=metadata,
        mode=mode,
        needs_merge=needs_merge,
    )


def _split(digest: str | None) -> tuple[int, int]:
    if not digest:
        return 0, 0
    return int(digest[16:], 16), int(digest[:16], 16)


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


def verified(prepared: Sequence[Prepared]) -> Sequence[Prepared]:
    """``prepared``, once every staged Delivery of the Run is still what was recorded.

    Each Delivery's bytes are checked against its recorded size and sha256,
    and its rows against its record count, before the Run's first commit: an
    altered one (bytes changed, rows added) raises DeliveryAltered naming it,
    and the Run commits nothing.
    """
    for p in prepared:
        for d in p.deliveries:
            problem = _alteration(d)
            if problem is not None:
                raise DeliveryAltered(
                    f"{d.source}.{d.dataset}: Delivery {d.id} (sequence {d.sequence}, "
                    f"{d.path.name}) {problem} since it was staged; this run committed nothing",
                    hint="find what changed the run's staging directory, then capture again: "
                    "the next capture stages the rows anew",
                )
    return prepared


def _alteration(d: StagedDelivery) -> str | None:
    """How a staged Delivery differs from its record, or None."""
    from combined.delivery._staging import file_hash

    try:
        if d.path.stat().st_size != d.byte_count or file_hash(d.path) != d.content_hash:
            return "no longer holds the bytes it was recorded with (size and sha256)"
        rows = pq.read_metadata(d.path).num_rows
    except FileNotFoundError:
        return "is gone from the run's staging"
    except (OSError, pa.ArrowInvalid):
        return "is no longer a readable Parquet file"
    if rows != d.record_count:
        return f"holds {rows} records, not the {d.record_count} recorded"
    return None


# -- commit and projection -----------------------------------------------------------------
