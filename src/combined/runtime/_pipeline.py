"""One dataset's capture: stage, (reduce and deliver: ``_prepare``), commit, project.

The projection is a function of the lake commit's metadata and the raw
layer only, so :func:`project_commit` serves both the normal path and the
repair of a catalog that lags the lake.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from combined.capture._reduce import Transition
from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.connectors.abc import Extraction, ReadRequest, Source
from combined.delivery import PartWriter, StagedDelivery, StagingArea, part_schema
from combined.errors import (
    ConfigError,
    LakeError,
    ProtocolViolation,
    SchemaMismatch,
)
from combined.lake import (
    LakeLayout,
    LakeTable,
    link_or_copy,
    linked_name,
)
from combined.protocol import ExtractionReceipt, RecordBatchMessage, StateMessage
from combined.protocol import _provenance as prov
from combined.protocol._digest import digest_of
from combined.runtime._barrier import CheckpointBarrier
from combined.runtime._deadline import reading
from combined.runtime._drift import judge_drift
from combined.runtime._faults import arm_commit_watchdog, fault
from combined.runtime._memory import release_memory
from combined.runtime._reporter import Reporter
from combined.runtime._schema_check import (
    RESERVED_PREFIX,
    check_batch,
    check_names,
    family,
    parse_type,
)
from combined.runtime._stager import CaptureStager


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    """A dataset's declaration as frozen in the Run's admission."""

    source: str
    name: str
    relation: str
    key: tuple[str, ...]
    strategy: str
    sync_mode: str
    cursor: Mapping[str, Any] | None
    columns: tuple[str, ...] | None
    batch_rows: int
    max_rows: int
    max_bytes: int
    drift: Mapping[str, str]
    quarantine_reader: str
    review_every_s: int
    control_sum: str | None = None
    #: Whether every version of every row is kept (``history: true``).
    history: bool = False
    #: The soft-delete flag (``{"flag": COLUMN, "value": V or None}``), when declared.
    deletes: Mapping[str, Any] | None = None


@dataclass
class Staged:
    """What extraction left in staging for one dataset."""

    plan: DatasetPlan
    extraction: Extraction
    parts: list[Path]
    schema: pa.Schema
    state: Mapping[str, Any] | None
    position: str | None
    receipt: ExtractionReceipt
    rows: int
    drift: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the capture is the whole relation (absent ids become deletes).
    full: bool = False
    #: The checkpoint the read started from.
    prior_state: Mapping[str, Any] | None = None
    #: For a bounded capture: SQL over the lake's columns selecting the range it covers.
    current_filter: str | None = None
    #: Control totals read in the capture's snapshot (rows, optional column sum).
    control: Mapping[str, Any] | None = None
    #: Each column's identity at the source (for renames), as the commit records it.
    fields: Mapping[str, str] | None = None
    #: Columns the source declares NOT NULL, where a change stream told them.
    not_null: tuple[str, ...] = ()
    #: Columns a change stream filled from the source, with the source's nulls in each
    #: at the lake's checkpoint (reconciliation compares the lake's).
    filled_nulls: Mapping[str, int] | None = None
    #: An event stream's columns that arrived unfilled, with the source's rows holding a value.
    unfilled: Mapping[str, int] | None = None
    #: For a backfill: SQL over the lake's columns selecting the range, whatever its column.
    landed_filter: str | None = None
    #: Whether control totals that differ from what landed block publication (a backfill).
    bounded: bool = False


@dataclass
class Prepared:
    """A reduced transition written as Deliveries, ready to commit."""

    staged: Staged
    transition: Transition
    deliveries: list[StagedDelivery]
    changes_path: Path | None
    metadata: dict[str, Any]
    mode: str
    needs_merge: bool


def table_of(layout: LakeLayout, plan: DatasetPlan) -> LakeTable:
    """The lake table of a dataset."""
    return layout.dataset_table(plan.source, plan.name)


# -- extraction -------------------------------------------------------------------------


def stage(
    plan: DatasetPlan,
    source: Source,
    area: StagingArea,
    layout: LakeLayout,
    reporter: Reporter,
    declared: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Staged:
    """Read one dataset into private, ordinal-keyed staging under the run's limits.

    ``declared`` maps column names to their discovered Arrow types: every
    batch is checked against it, the first one included.
    """
    table = table_of(layout, plan)
    last = table.latest_commit()
    # The checkpoint lives with the data: the lake's newest commit is authoritative.
    prior_state = last.get("checkpoint") if last else None
    committed_schema = table.schema()
    from combined.connectors.abc import CursorSpec

    cursor = None
    if plan.cursor is not None:
        cursor = CursorSpec(
            column=plan.cursor["column"],
            lookback=timedelta(seconds=float(plan.cursor["lookback"]))
            if plan.cursor.get("lookback_is_duration")
            else plan.cursor.get("lookback"),
            trust=plan.cursor.get("trust", "declared"),
            # An admission frozen before the setting existed takes its default.
            nulls=plan.cursor.get("nulls", "fail"),
        )
    if plan.sync_mode == "append" and plan.strategy == "cursor" and type(source).REDELIVERS:
        raise ConfigError(
            f"{plan.source}.{plan.name} appends what a {type(source).name} cursor read hands "
            "over, and such a read may hand over again records an earlier read already did "
            "(it resumes at its bookmark, inclusive): they would be stored twice",
            hint="use sync_mode: incremental, which merges them by key",
        )
    request = ReadRequest(
        dataset=plan.name,
        relation=plan.relation,
        key=plan.key,
        strategy=plan.strategy,  # type: ignore[arg-type]
        state=prior_state,
        cursor=cursor,
        columns=plan.columns,
        batch_rows=plan.batch_rows,
        options=_read_options(plan, source, options, committed_schema),
    )
    extraction = source.read(request)
    writer = PartWriter(
        area, f"{plan.source}/{plan.name}/capture", max_rows=plan.max_rows, max_bytes=plan.max_bytes
    )
    with reading(extraction):  # aborted if it fails; under the Attempt's deadline
        return _consume(
            plan, extraction, writer, committed_schema, last, prior_state, reporter, declared
        )


def _read_options(
    plan: DatasetPlan, source: Source, options: Mapping[str, Any] | None, lake: pa.Schema | None
) -> dict[str, Any]:
    """The read's options; asks for control totals where the source can count them.

    A change stream is told the columns the lake holds (``lake_columns``):
    one it then sees arrive was added since, and the rows no change carries
    take their value from the source. An event stream (``append``) is told
    too, but is not filled (``event_stream``): its events happened before
    the column existed, and the read counts the rows no event gives a value.
    """
    out = dict(options or {})
    if plan.strategy == "cdc" and lake is not None:
        out["lake_columns"] = [n for n in lake.names if not n.startswith(RESERVED_PREFIX)]
        if plan.sync_mode == "append":
            out["event_stream"] = True
    if (
        type(source).SUPPORTS_CONTROL_TOTALS
        and plan.strategy in ("snapshot", "cursor")
        and plan.sync_mode == "incremental"  # an event stream's rows are not the table's
        # A cursor's control totals count the whole relation, flagged rows
        # included, which its delta cannot take away (a snapshot's can: _prepare).
        and (plan.deletes is None or plan.strategy == "snapshot")
    ):
        out["control_totals"] = plan.control_sum or True
    return out


def _control(extraction: Extraction) -> dict[str, Any] | None:
    totals = getattr(extraction, "control_totals", None)
    if totals is None:
        return None
    return {"rows": totals.rows, "sum_column": totals.sum_column, "sum": totals.sum}


def _consume(
    plan: DatasetPlan,
    extraction: Extraction,
    writer: PartWriter,
    committed_schema: pa.Schema | None,
    last: Mapping[str, Any] | None,
    prior_state: Mapping[str, Any] | None,
    reporter: Reporter,
    declared: Mapping[str, str] | None,
) -> Staged:
    barrier = CheckpointBarrier()
    schema: pa.Schema | None = None
    #: Fields an earlier batch had and a later one lacks: dropped while streaming.
    dropped: set[str] = set()
    rows = nbytes = 0
    stager = CaptureStager(
        writer, key=plan.key, hash_rows=plan.strategy != "cdc", digest=digest_of(committed_schema)
    )
    try:
        for msg in extraction:
            if isinstance(msg, StateMessage):
                barrier.state(msg.state, position=msg.position)
                continue
            assert isinstance(msg, RecordBatchMessage)
            batch = msg.batch
            check_batch(f"{plan.source}.{plan.name}", batch, declared)
            if schema is None or batch.schema.names != schema.names:
                check_names(
                    f"{plan.source}.{plan.name}",
                    batch.schema.names,
                    # Only a change stream's reader adds its control columns.
                    control=prov.CONTROL_COLUMNS if plan.strategy == "cdc" else (),
                    # (a full refresh replaces the table's columns with the read's)
                    committed=committed_schema.names
                    if committed_schema is not None and plan.sync_mode != "full_refresh"
                    else (),
                )
            if schema is None:
                schema = batch.schema
            elif batch.schema != schema:
                # A field that appears mid-read (a column added while streaming) widens
                # the capture's schema; one that disappears (dropped while streaming)
                # stays in it, null from then on. The drift policy judges both once
                # the read is done.
                dropped.update(n for n in schema.names if n not in batch.schema.names)
                for f in batch.schema:
                    if f.name not in schema.names:
                        schema = schema.append(f)
                batch = _conform(plan, batch, schema)
            stager.put(batch)
            barrier.records(batch.num_rows)
            rows += batch.num_rows
            nbytes += batch.nbytes
            reporter.progress(plan.name, rows, nbytes, 0)
        if schema is None:
            schema = _empty_schema(committed_schema, declared)
        parts = stager.close(schema)
    except BaseException:
        stager.abort()
        raise
    finally:
        # Give the read's buffers back before the reduction allocates its own.
        release_memory()
    final = pa.schema([f for f in schema if f.name not in dropped])  # the source's shape now
    before = last.get("fields") if last else None
    now = getattr(declared, "identity", None) or before
    drift = judge_drift(plan, committed_schema, final, parts, before, now)
    checkpoint = barrier.committable(through_records=rows)
    return Staged(
        plan=plan,
        extraction=extraction,
        parts=parts,
        schema=part_schema(parts[-1]),  # the last part has every field
        state=checkpoint[0] if checkpoint else prior_state,
        position=checkpoint[1] if checkpoint else (last.get("source_position") if last else None),
        receipt=extraction.receipt,
        rows=rows,
        drift=drift,
        full=plan.strategy == "snapshot"
        or bool(
            checkpoint
            and checkpoint[0].get("stitched")
            and not any((prior_state or {}).get(k) for k in ("lsn", "binlog"))
        ),
        prior_state=prior_state,
        control=_control(extraction),
        fields=now,
        # An event stream keeps events from before a column existed: no check.
        not_null=tuple(getattr(extraction, "not_null_columns", {}).get(plan.name, ()))
        if plan.sync_mode != "append"
        else (),
        filled_nulls=getattr(extraction, "filled_nulls", {}).get(plan.name),
        unfilled=getattr(extraction, "unfilled_columns", {}).get(plan.name),
    )


def _empty_schema(committed: pa.Schema | None, declared: Mapping[str, str] | None) -> pa.Schema:
    # An empty read has no batch to take a schema from: the lake's, else the declared one.
    if committed is not None:
        return pa.schema([f for f in committed if not f.name.startswith("_combined_")])
    return pa.schema([pa.field(n, parse_type(t)) for n, t in (declared or {}).items()])


def _conform(plan: DatasetPlan, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast a later batch to the capture's first schema, or say which column does not fit."""
    arrays = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            continue
        col = batch.column(idx)
        if col.type != f.type:
            before, now = family(str(f.type)), family(str(col.type))
            # A cast across families (int64 to string) would "fit" by rewriting values.
            fits = (
                before == now
                or now == "null"
                or (before in ("float", "decimal") and now == "integer")
            )
            try:
                if not fits:
                    raise pa.ArrowInvalid(f"{col.type} is not {f.type}")
                col = pc.cast(col, f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatch(
                    f"a record of {plan.source}.{plan.name} does not fit the schema of the "
                    f"capture: column {f.name!r} holds {f.type} in earlier records and "
                    f"{col.type} in this one",
                    hint="fix the source value or declare the column's type; "
                    "nothing was committed for this dataset",
                ) from exc
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- reduction and deliveries -------------------------------------------------------------


def commit(prepared: Prepared, layout: LakeLayout) -> tuple[int | None, datetime | None]:
    """One lake commit for the dataset's transition; returns (lake version, acceptance time)."""
    plan = prepared.staged.plan
    table = table_of(layout, plan)
    if not prepared.deliveries:
        return table.version(), None
    ingested_at = datetime.fromisoformat(prepared.metadata["ingested_at"])
    paths = [d.path for d in prepared.deliveries]
    schema = pq.read_schema(str(paths[0]))

    def reader() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(schema, _read(paths))

    result = table.commit(
        first_sequence=prepared.deliveries[0].sequence,
        last_sequence=prepared.deliveries[-1].sequence,
        mode=prepared.mode,  # type: ignore[arg-type]
        data=reader,
        # Delivery files are final: an append commits them as the table's files.
        files=[(d.path, d.stats, d.content_hash) for d in prepared.deliveries if d.stats]
        if all(d.stats is not None for d in prepared.deliveries)
        else None,
        metadata=prepared.metadata,
        needs_merge=prepared.needs_merge,
        before_write=arm_commit_watchdog,
    )
    if result.skipped and result.run_id != prepared.metadata["run_id"]:
        # Another run committed these sequences first (it held the dataset when
        # this one lost its lease): the lake holds its Deliveries, not ours.
        # Projecting, billing or acknowledging ours would describe rows the
        # lake never received and move the checkpoint past what it holds.
        first, last = prepared.deliveries[0].sequence, prepared.deliveries[-1].sequence
        by = f"run {result.run_id}" if result.run_id else "another writer"
        raise ProtocolViolation(
            f"{plan.source}.{plan.name}: delivery sequences {first}..{last} were committed "
            f"by {by} (lake version {result.lake_version}), not by this run; this run's "
            "Deliveries were discarded and nothing of it was published or acknowledged",
            hint="capture again: the next run starts from what the lake holds",
        )
    # The acceptance time is the one stamped on the rows and in the commit metadata.
    return result.lake_version, ingested_at if not result.skipped else result.committed_at


def _read(paths: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in paths:
        pf = pq.ParquetFile(str(path))
        try:
            yield from pf.iter_batches(batch_size=65_536)
        finally:
            pf.close()


def raw_location(layout: LakeLayout, source: str, dataset: str, file: str) -> str:
    """Where a committed Delivery (or transition file) lives in the raw layer."""
    return layout.store.child(layout.deliveries(source, dataset), file)


def promote(
    layout: LakeLayout,
    staging_root: Path,
    source: str,
    dataset: str,
    files: list[str],
    hashes: Mapping[str, str] | None = None,
) -> None:
    """Move committed files from the run's staging into the raw layer (idempotent).

    Into an object store a file is copied server-side from the table file
    holding the same bytes (``hashes``: a file's sha256, the name of its
    linked table file), else uploaded; each object whole or absent.
    """
    store = layout.store
    store.makedirs(layout.deliveries(source, dataset))
    for name in files:
        src = staging_root / source / dataset / "deliveries" / name
        dst = raw_location(layout, source, dataset, name)
        if not src.exists() or store.exists(dst):
            continue
        digest = (hashes or {}).get(name)
        if store.remote and digest and _copy_linked(layout, source, dataset, digest, src):
            src.unlink()
        else:
            store.move_in(src, dst)


def _copy_linked(layout: LakeLayout, source: str, dataset: str, digest: str, src: Path) -> bool:
    """Copy the table file holding ``src``'s bytes into the raw layer, server-side.

    That file is named after the bytes' sha256 ``digest`` (:func:`linked_name`)
    and must have ``src``'s size; False when no such file is there (the
    commit rewrote the rows, or the table was compacted and vacuumed since).
    """
    store = layout.store
    table_file = store.child(layout.table(source, dataset), linked_name(digest))
    try:
        if not store.exists(table_file) or store.size(table_file) != src.stat().st_size:
            return False
        store.copy(table_file, raw_location(layout, source, dataset, src.name))
    except OSError:
        return False
    return True


def _restore_from_table(
    layout: LakeLayout, source: str, dataset: str, d: Mapping[str, Any], lake_version: int
) -> bool:
    """Put a committed Delivery missing from staging back into the raw layer from the table.

    A Delivery committed by linking is a table data file byte for byte: when
    its staging copy is gone (recovery erased the staging of a Run that had
    stalled inside its commit), the table file with its size and sha256 is
    linked into the raw layer under the Delivery's name (found by name when
    it is named after its bytes, else by reading the table's files). False
    when no table file holds its bytes (a rewrite commit re-encoded its rows).
    """
    store = layout.store
    dst = raw_location(layout, source, dataset, d["file"])
    named = store.child(layout.table(source, dataset), linked_name(d["content_hash"]))
    files = layout.dataset_table(source, dataset).files(lake_version)
    for file in sorted(files, key=lambda f: f != named):
        try:
            if store.size(file) != int(d["bytes"]) or store.sha256(file) != d["content_hash"]:
                continue
        except OSError:
            continue
        if store.remote:
            store.copy(file, dst)  # server-side; an object is whole or absent
            return True
        path, partial = Path(file), Path(dst).with_name(f".{Path(dst).name}.restoring")
        partial.unlink(missing_ok=True)  # an interrupted restore's
        link_or_copy(path, partial)
        os.replace(partial, dst)
        return True
    return False


def _complete_raw_layer(
    layout: LakeLayout, source: str, dataset: str, meta: Mapping[str, Any]
) -> set[str]:
    """Check every committed file of ``meta`` is in the raw layer, restoring what can be.

    Returns the Deliveries without rows that are gone (a quiet stream's, which
    only carried a position): no table file holds them, and no row or MAR
    depends on them. Any other missing file raises LakeError.
    """
    missing = [
        d
        for d in meta.get("deliveries") or []
        if not layout.store.exists(raw_location(layout, source, dataset, d["file"]))
        and not _restore_from_table(layout, source, dataset, d, int(meta["lake_version"]))
    ]
    empty = {d["file"] for d in missing if int(d["records"]) == 0}
    names = [d["file"] for d in missing if d["file"] not in empty]
    changes = meta.get("changes_file")
    if changes and not layout.store.exists(raw_location(layout, source, dataset, changes)):
        names.append(changes)
    if names:
        raise LakeError(
            f"{source}.{dataset}: lake version {meta['lake_version']} (run {meta['run_id']}) "
            f"committed {', '.join(names)}, which neither its run's staging nor the raw layer "
            f"holds ({layout.deliveries(source, dataset)}); the lake holds the rows, but the "
            "raw layer and MAR cannot be completed from it",
            hint="restore the files into the raw layer from a backup, then run `combined repair`",
        )
    return empty


def _history_told(catalog: Catalog, source: str, dataset: str) -> Any:
    """Record a history's restart from the projection as Activity (``history.restarted``)."""

    def told(body: dict[str, Any]) -> None:
        with catalog.begin() as conn:
            cat.emit(conn, "history.restarted", source=source, dataset=dataset, **body)

    return told


def project_commit(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    *,
    staging_root: Path | None = None,
) -> None:
    """Make the catalog reflect one lake commit; idempotent, from lake evidence only."""
    from combined.lake._history import maintain_history
    from combined.usage import record_usage

    deliveries = list(meta.get("deliveries") or [])
    files = [d["file"] for d in deliveries]
    if meta.get("changes_file"):
        files.append(meta["changes_file"])
    if staging_root is None:
        staging_root = layout.staging(meta["run_id"])
    hashes = {d["file"]: d["content_hash"] for d in deliveries if d.get("content_hash")}
    promote(layout, staging_root, source, dataset, files, hashes)
    gone_empty = _complete_raw_layer(layout, source, dataset, meta)
    lake_version = int(meta["lake_version"])
    ingested_at = datetime.fromisoformat(meta["ingested_at"])
    months: dict[str, dict[str, int]] = {}
    # The transition's changes: its change list, or (``changes_from``) its
    # Deliveries, which then hold exactly its changes.
    changes = [meta["changes_file"]] if meta.get("changes_file") else []
    from_deliveries = not changes and meta.get("changes_from") == "deliveries"
    if from_deliveries:
        changes = [f for f in files if f not in gone_empty]
    if changes:
        months = record_usage(
            layout,
            source,
            dataset,
            [raw_location(layout, source, dataset, f) for f in changes],
            month=f"{ingested_at:%Y-%m}",
            unique=bool(meta.get("changes_unique")),
            deliveries=from_deliveries,
        )
    if meta.get("history"):
        # Before the catalog moves: a crash in between leaves the catalog
        # behind the lake, and its catch-up mirrors what the history lacks.
        maintain_history(layout, source, dataset, _history_told(catalog, source, dataset))
        fault("after_history")
    version = meta["version"]
    tr = meta["transition"]
    with catalog.begin() as conn:
        # Projecting a commit the catalog already holds changes nothing: no
        # checkpoint moves back and no event is told twice.
        fresh = int(cat.get_dataset(conn, source, dataset).last_sequence or 0) < int(
            meta.get("last_sequence") or 0
        )
        for d in deliveries:
            cat.record_delivery(
                conn,
                id=d["id"],
                run_id=meta["run_id"],
                source=source,
                dataset=dataset,
                sequence=d["sequence"],
                schema_revision=d["schema_revision"],
                record_count=d["records"],
                byte_count=d["bytes"],
                content_hash=d["content_hash"],
                state="staged",
                path=raw_location(layout, source, dataset, d["file"]),
            )
        cat.mark_deliveries(
            conn,
            [d["id"] for d in deliveries],
            "committed",
            lake_version=lake_version,
            committed_at=ingested_at,
        )
        if version.get("id") and cat.get_version(conn, version["id"]) is None:
            cat.add_version(
                conn,
                id=version["id"],
                source=source,
                dataset=dataset,
                parent_id=version.get("parent"),
                transition_digest=tr["digest"],
                inserts=tr["inserts"],
                updates=tr["updates"],
                deletes=tr["deletes"],
                row_count=version["row_count"],
                content_digest=version["content_digest"],
                run_id=meta["run_id"],
                lake_version=lake_version,
            )
        schema = meta.get("schema")
        values: dict[str, Any] = {
            "checkpoint": meta.get("checkpoint"),
            "source_position": meta.get("source_position"),
            "last_sequence": int(meta.get("last_sequence") or 0),
            "lake_version": lake_version,
            "current_version": version.get("id"),
        }
        if schema is not None:
            values["schema"] = schema
        if deliveries:
            values["schema_revision"] = deliveries[-1]["schema_revision"]
        for month, counts in months.items():
            cat.set_usage(conn, source, dataset, month, **counts)
        if not fresh:
            return
        cat.update_dataset(conn, source, dataset, **values)
        for event in meta.get("drift") or []:
            cat.emit(conn, "drift", source=source, dataset=dataset, run_id=meta["run_id"], **event)
        cat.emit(
            conn,
            "delivery.committed",
            source=source,
            dataset=dataset,
            run_id=meta["run_id"],
            lake_version=lake_version,
            deliveries=len(deliveries),
            **tr,
        )


def commit_schema_fields(path: Path) -> list[list[str]]:
    """The ``[name, type]`` list of a Delivery file's schema (kept in the catalog)."""
    return [[f.name, str(f.type)] for f in pq.read_schema(str(path))]


def commit_reset(
    catalog: Catalog, layout: LakeLayout, source: str, dataset: str, reason: str
) -> int | None:
    """Record, in the lake, that a dataset's checkpoint is void (a recorded decision).

    The next capture then starts from scratch (a CDC dataset re-snapshots and
    reconciles against the lake) instead of resuming from a position its
    source can no longer serve. Returns the lake version, or None without a table.
    """
    table = layout.dataset_table(source, dataset)
    schema = table.schema()
    if schema is None:
        return None
    seq = table.committed_sequence() + 1
    now = datetime.now(UTC)
    with catalog.begin() as conn:
        current = cat.get_dataset(conn, source, dataset).current_version
    meta: dict[str, Any] = {
        "dataset": f"{source}.{dataset}",
        "run_id": f"reset-{now:%Y%m%d%H%M%S}",
        "admission_id": None,
        "first_sequence": seq,
        "last_sequence": seq,
        "deliveries": [],
        "changes_file": None,
        "source_position": None,
        "checkpoint": None,
        "reset": reason,
        "extraction_receipt": None,
        "transition": {
            "inserts": 0,
            "updates": 0,
            "deletes": 0,
            "unchanged": 0,
            "captured": 0,
            "digest": "0" * 32,
        },
        "version": {"id": current, "parent": current},
        "drift": [],
        "schema": None,
        "ingested_at": now.isoformat(),
    }
    result = table.commit(
        first_sequence=seq,
        last_sequence=seq,
        mode="append",
        data=lambda: pa.RecordBatchReader.from_batches(schema, []),
        metadata=meta,
        needs_merge=False,
    )
    meta["lake_version"] = result.lake_version
    project_commit(catalog, layout, source, dataset, meta)
    with catalog.begin() as conn:
        cat.emit(conn, "checkpoint.reset", source=source, dataset=dataset, reason=reason)
    return result.lake_version
