"""Extract: read one dataset from its source into private staging, batch by batch.

Each batch is checked against the declared and committed schemas, numbered,
identified and hashed (:mod:`combined.runtime._stage`) and staged in bounded
parts; the read's checkpoint is what the barrier lets commit. The drift
policy judges the capture's schema once the read is done. A partitioned
backfill reads its range in :mod:`combined.runtime._backfill`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from combined.capture._values import comparable
from combined.connectors.abc import CursorSpec, Extraction, ReadRequest, Source
from combined.delivery import PartWriter, StagingArea, part_schema
from combined.errors import ConfigError, SchemaMismatch, SourceError
from combined.lake import LakeLayout
from combined.lake._positions import commit_identity
from combined.protocol import RecordBatchMessage, StateMessage
from combined.protocol import _provenance as prov
from combined.protocol._digest import BINARY, digest_of
from combined.runtime._barrier import CheckpointBarrier
from combined.runtime._deadline import reading
from combined.runtime._drift import check_key, check_moved, judge_drift
from combined.runtime._fold import capture_columns, expected_fold, kept_fold
from combined.runtime._gap import refuse_recorded
from combined.runtime._memory import release_memory
from combined.runtime._plan import DatasetPlan, Staged, resumed_commit, table_of
from combined.runtime._reporter import Reporter
from combined.runtime._schema_check import (
    RESERVED_PREFIX,
    check_batch,
    check_names,
    family,
    parse_type,
)
from combined.runtime._stage import CaptureStager


def extract(
    plan: DatasetPlan,
    source: Source,
    area: StagingArea,
    layout: LakeLayout,
    reporter: Reporter,
    declared: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
    kept: Mapping[str, Any] | None = None,
) -> Staged:
    """Read one dataset into private, ordinal-keyed staging under the run's limits.

    ``declared`` maps column names to their discovered Arrow types: every
    batch is checked against it, the first one included. ``kept``: the
    fold the catalog keeps of the dataset's last capture that changed
    nothing (``runtime._fold``).
    """
    table = table_of(layout, plan).pinned()
    # The checkpoint lives with the data: the lake's newest commit is authoritative
    # (or the position captures that changed no row kept after it).
    last = resumed_commit(layout, plan, table)
    prior_state = last.get("checkpoint") if last else None
    refuse_recorded(plan, prior_state)  # a gap in its change stream, until a new snapshot
    check_key(plan, last, getattr(declared, "identity", None))
    committed_schema = table.schema()
    if getattr(type(source), "IDENTITY_IS_COLUMN", False):
        check_moved(plan, last, getattr(declared, "identity", None), committed_schema)
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
        cursor=_cursor(plan),
        columns=plan.columns,
        batch_rows=plan.batch_rows,
        options=_read_options(plan, source, options, committed_schema),
    )
    extraction = source.read(request)
    if plan.name in (getattr(extraction, "stream_gaps", None) or {}):
        # Its table was dropped: the changes read are the old table's, which the
        # discovery (of what is there now: nothing, or a table made since) never saw.
        declared = None
    writer = PartWriter(
        area, f"{plan.source}/{plan.name}/capture", max_rows=plan.max_rows, max_bytes=plan.max_bytes
    )
    with reading(extraction):  # aborted if it fails; under the Attempt's deadline
        return _consume(
            plan,
            extraction,
            writer,
            committed_schema,
            _Last(last, cache(table.rows_kept_since), kept, table.version(), committed_schema),
            reporter,
            declared,
        )


def _cursor(plan: DatasetPlan) -> CursorSpec | None:
    """The cursor a cursor read resumes from, as the admission froze it."""
    if plan.cursor is None:
        return None
    return CursorSpec(
        column=plan.cursor["column"],
        lookback=timedelta(seconds=float(plan.cursor["lookback"]))
        if plan.cursor.get("lookback_is_duration")
        else plan.cursor.get("lookback"),
        trust=plan.cursor.get("trust", "declared"),
        # An admission frozen before the setting existed takes its default.
        nulls=plan.cursor.get("nulls", "fail"),
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
    if (
        plan.strategy == "snapshot"
        and plan.sync_mode == "incremental"
        and plan.deletes is None  # its flagged rows: counted by reading them (_reduce)
        and lake is not None
    ):
        # A read that finds the source as the committed read left it may take its
        # rows as unchanged and read nothing (files: the same files, unmodified).
        out["skip_unchanged"] = True
    if _folded(plan):
        out["change_marker"] = True  # (see runtime._fold)
    if plan.strategy in ("cdc", "cursor") and lake is not None:
        # (a cursor read restarts where a column new to the lake holds values below
        # its checkpoint; a change stream fills such a column from the source)
        out["lake_columns"] = [n for n in lake.names if not n.startswith(RESERVED_PREFIX)]
        if plan.sync_mode == "append":
            out["event_stream"] = True
    if (
        type(source).SUPPORTS_CONTROL_TOTALS
        and plan.strategy in ("snapshot", "cursor")
        and plan.sync_mode == "incremental"  # an event stream's rows are not the table's
        # A cursor's control totals count the whole relation, flagged rows
        # included, which its delta cannot take away (a snapshot's can: _reduce).
        and (plan.deletes is None or plan.strategy == "snapshot")
    ):
        out["control_totals"] = plan.control_sum or True
    return out


def _folded(plan: DatasetPlan) -> bool:
    """Whether the capture's rows are folded: a snapshot mirror's (``runtime._fold``)."""
    return plan.strategy == "snapshot" and plan.sync_mode == "incremental" and not plan.deletes


@dataclass(frozen=True, slots=True)
class _Last:
    """The lake table as the capture began: its newest Combined commit, and what followed it."""

    commit: Mapping[str, Any] | None
    #: Whether only compactions and vacuums followed a lake version (``LakeTable``).
    rows_kept_since: Callable[[int], bool]
    #: The fold of a later capture that changed nothing, as the catalog keeps it.
    kept: Mapping[str, Any] | None = None
    #: The lake version the capture began at (None: no table yet).
    version: int | None = None
    #: The table's schema as the capture began.
    schema: pa.Schema | None = None

    def value_payload(self, plan: DatasetPlan, staged: pa.Schema) -> pa.Schema | None:
        """The payload a snapshot of ``staged`` columns is compared with the table by, or None.

        In the lake's types (``capture._values.comparable``). The table's
        newest commit made a version of ``VALUES_MIN_ROWS`` rows or more and
        staged the same columns in the same types (the canonical texts of
        equal values are equal), no commit changed the table since, and it
        stores each column in a type the staged one maps to exactly.
        """
        last = self.commit
        if not (plan.key and last and self.schema is not None):
            return None
        if _lake_rows(last) < VALUES_MIN_ROWS:
            return None  # (hashing a small table costs less than comparing it)
        if last.get("capture_columns") != capture_columns(staged):
            return None
        if digest_of(self.schema) != BINARY:
            return None
        payload = comparable(staged, self.schema, plan.key)
        version = last.get("lake_version")
        kept = payload is not None and isinstance(version, int) and self.rows_kept_since(version)
        return payload if kept else None


#: Rows from which a table is compared by value rather than hashed as read: the
#: comparison's own queries cost more than md5 of a small table's rows (100
#: tables of 1,000 rows, one row changed in each: 130 CPU ms a table hashed
#: as read, 156 compared; `bench.many`), and save ~17% of the CPU of 5M rows.
VALUES_MIN_ROWS = 100_000


def _lake_rows(last: Mapping[str, Any]) -> int:
    """The rows of the dataset version the commit ``last`` made (0 if it does not say)."""
    version = last.get("version")
    rows = version.get("row_count") if isinstance(version, Mapping) else None
    return rows if isinstance(rows, int) else 0


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
    lake: _Last,
    reporter: Reporter,
    declared: Mapping[str, str] | None,
) -> Staged:
    last = lake.commit
    prior_state = last.get("checkpoint") if last else None
    barrier = CheckpointBarrier()
    shape = _Shape(plan, committed_schema, declared)
    rows = nbytes = 0
    expected: Mapping[str, Any] | None = None
    stager = CaptureStager(
        writer,
        key=plan.key,
        # A change stream's rows are hashed by the reduction (their operations, their
        # unchanged values); a stitched snapshot's here, as a snapshot's are: its
        # reduction then streams them (a 2M-row first capture 554 -> ~374 MB).
        hash_rows=plan.strategy != "cdc" or bool(getattr(extraction, "ROWS_ONLY", False)),
        by_content=plan.sync_mode != "append",
        digest=digest_of(committed_schema),
    )
    try:
        for msg in extraction:
            if isinstance(msg, StateMessage):
                barrier.state(msg.state, position=msg.position)
                continue
            assert isinstance(msg, RecordBatchMessage)
            if stager.batches == 0:
                expected = _fold_first(plan, stager, extraction, lake, msg.batch.schema)
            batch = shape.fit(msg.batch)
            stager.put(batch)
            barrier.records(batch.num_rows)
            rows += batch.num_rows
            nbytes += batch.nbytes
            reporter.progress(plan.name, rows, nbytes, 0)
        # An empty read judges nothing against the lake's own schema (below): the
        # columns the last commit recorded stay the ones the next read is judged by.
        unjudged = shape.schema is None and committed_schema is not None
        if shape.schema is None:
            shape.schema = empty_schema(
                committed_schema, declared, getattr(extraction, "empty_schema", None)
            )
            _check_empty_key(plan, shape.schema)
        staged = stager.close(shape.schema)
        parts, fold, verdict, by_value = _settled(
            stager,
            staged,
            extraction,
            expected,
            lambda: lake.value_payload(plan, part_schema(staged[-1])),
        )
    except BaseException:
        stager.abort()
        raise
    finally:
        # Give the read's buffers back before the reduction allocates its own.
        release_memory()
    before = last.get("fields") if last else None
    now = getattr(declared, "identity", None) or before
    drift = judge_drift(plan, committed_schema, shape.final(), parts, before, now)
    if unjudged and before is not None:
        # (recording the source's columns now, a column dropped meanwhile was taken
        # for one judged before: its drop went by at the next change, silently)
        now = before
    checkpoint = barrier.committable(through_records=rows)
    # Read nothing, the source as the committed read left it: no row is absent.
    unchanged = getattr(extraction, "unchanged_rows", None)
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
        full=_whole(plan, checkpoint, prior_state) and unchanged is None,
        unchanged_rows=unchanged,
        prior_state=prior_state,
        after=commit_identity(last) if last else None,
        fields=now,
        # (a capture that drifted commits what the policy made of it: no fold)
        fold=fold if not drift else None,
        fold_verdict=verdict,
        by_value=by_value,
        kept_fold=kept_fold(fold, last, lake.version) if not drift and verdict != "same" else None,
        **_told(plan, extraction),
    )


def _fold_first(
    plan: DatasetPlan,
    stager: CaptureStager,
    extraction: Extraction,
    lake: _Last,
    schema: pa.Schema,
) -> Mapping[str, Any] | None:
    """At the first batch: fold the rows if the source marks its state (``runtime._fold``).

    Hashing waits for the fold's verdict where the marker is the one the
    lake's newest commit recorded, and for the reduction where the rows may
    be compared with the lake's by value (``capture._values``). Returns the
    recorded fold the capture is checked against, or None.
    """
    if not _folded(plan):
        return None
    marker = getattr(extraction, "change_marker", None)
    expected = expected_fold(lake.commit, marker, lake.rows_kept_since, lake.kept)
    by_value = lake.value_payload(plan, schema) is not None
    if marker or by_value:
        stager.fold_rows(fold=bool(marker), defer=expected is not None or by_value)
    return expected


def _settled(
    stager: CaptureStager,
    parts: list[Path],
    extraction: Extraction,
    expected: Mapping[str, Any] | None,
    by_value: Callable[[], pa.Schema | None],
) -> tuple[list[Path], Mapping[str, Any] | None, str | None, pa.Schema | None]:
    """The staged parts, the capture's fold to record, its verdict, and the payload compared.

    Parts staged unhashed are hashed now, unless the fold is the recorded one
    (verdict ``same``) or the reduction compares them with the lake by value
    (``by_value()``: the payload the whole capture's columns allow). The verdict is
    ``differed`` where the fold was checked and was not the recorded one,
    None where it was not checked.
    """
    folded, marker = stager.fold, getattr(extraction, "change_marker", None)
    fold = folded.record(marker) if folded is not None and marker else None
    if not stager.deferred:
        return parts, fold, None, None
    if folded is not None and folded.matches(expected or {}):
        return parts, fold, "same", None
    verdict = "differed" if expected is not None else None
    payload = by_value()
    if payload is not None:
        return parts, fold, verdict, payload
    return stager.hash_staged(parts, stager.writer.again("hashed")), fold, verdict, None


def _told(plan: DatasetPlan, extraction: Extraction) -> dict[str, Any]:
    """What the read told beside its rows: control totals, NOT NULL, filled, unfilled columns."""
    return {
        "control": _control(extraction),
        # An event stream keeps events from before a column existed: no check.
        "not_null": tuple(getattr(extraction, "not_null_columns", {}).get(plan.name, ()))
        if plan.sync_mode != "append"
        else (),
        "filled_nulls": getattr(extraction, "filled_nulls", {}).get(plan.name),
        "unfilled": getattr(extraction, "unfilled_columns", {}).get(plan.name),
    }


def _whole(
    plan: DatasetPlan,
    checkpoint: tuple[Mapping[str, Any], str | None] | None,
    prior_state: Mapping[str, Any] | None,
) -> bool:
    """Whether the capture is the whole relation: a snapshot, or a change stream's first read."""
    return plan.strategy == "snapshot" or bool(
        checkpoint
        and checkpoint[0].get("stitched")
        and not any((prior_state or {}).get(k) for k in ("lsn", "binlog"))
    )


class _Shape:
    """The capture's schema as its batches arrive: each checked, later ones fitted to it."""

    def __init__(
        self,
        plan: DatasetPlan,
        committed: pa.Schema | None,
        declared: Mapping[str, str] | None,
    ) -> None:
        self.plan = plan
        self.committed = committed
        self.declared = declared
        self.schema: pa.Schema | None = None
        #: Fields an earlier batch had and a later one lacks: dropped while streaming.
        self.dropped: set[str] = set()

    def fit(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch``, checked and cast to the capture's schema (widened by any new field)."""
        plan, schema = self.plan, self.schema
        _check_fits(plan, batch, self.declared)
        if schema is None or batch.schema.names != schema.names:
            _check_key_columns(plan, batch.schema.names)
            check_names(
                f"{plan.source}.{plan.name}",
                batch.schema.names,
                # Only a change stream's reader adds its control columns.
                control=prov.CONTROL_COLUMNS if plan.strategy == "cdc" else (),
                # (a full refresh replaces the table's columns with the read's)
                committed=self.committed.names
                if self.committed is not None and plan.sync_mode != "full_refresh"
                else (),
            )
        if schema is None:
            self.schema = _lake_shaped(batch.schema, self.committed)
            if self.schema != batch.schema:
                batch = _conform(plan, batch, self.schema)
        elif batch.schema != schema:
            # A field that appears mid-read (a column added while streaming) widens
            # the capture's schema; one that disappears (dropped while streaming)
            # stays in it, null from then on. The drift policy judges both once
            # the read is done.
            self.dropped.update(n for n in schema.names if n not in batch.schema.names)
            for f in batch.schema:
                if f.name not in schema.names:
                    schema = schema.append(f)
            self.schema = schema
            batch = _conform(plan, batch, schema)
        return batch

    def final(self) -> pa.Schema:
        """The source's shape now: the capture's schema less the fields dropped meanwhile."""
        assert self.schema is not None
        return pa.schema([f for f in self.schema if f.name not in self.dropped])


def _lake_shaped(schema: pa.Schema, committed: pa.Schema | None) -> pa.Schema:
    """``schema`` with the lake's type for each column that holds the same values.

    A column of Arrow's null type (a JSON key null in every record, a Parquet
    null column) has no type of its own; a struct whose fields come in another
    order (JSON objects whose keys did) holds the same values. Read as they
    came, both were narrowed_type drift (int64 to string, struct<b, a> to
    struct<a, b>), and held the capture.
    """
    if committed is None:
        return schema
    lake = {f.name: f.type for f in committed}
    return pa.schema([f.with_type(_lake_form(f.type, lake.get(f.name))) for f in schema])


def _lake_form(read: pa.DataType, held: pa.DataType | None) -> pa.DataType:
    if held is None or pa.types.is_null(held):
        return read
    if pa.types.is_null(read) or (read != held and _ordered(read) == _ordered(held)):
        return held
    return read


def _ordered(t: pa.DataType) -> pa.DataType:
    """``t`` with every struct's fields in name order, nested ones too."""
    if pa.types.is_struct(t):
        fields = sorted((t.field(i) for i in range(t.num_fields)), key=lambda f: f.name)
        return pa.struct([f.with_type(_ordered(f.type)) for f in fields])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_ordered(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_ordered(t.value_type)))
    return t


def _check_fits(
    plan: DatasetPlan, batch: pa.RecordBatch, declared: Mapping[str, str] | None
) -> None:
    """Refuse a batch whose values do not fit the declared types, with the way out.

    A change stream's value of another type than the catalog's was made before
    an ``ALTER TABLE ... TYPE`` into another family (``int`` to ``text``): the
    source holds no such value any more, and every retry reads the same stream.
    """
    try:
        check_batch(f"{plan.source}.{plan.name}", batch, declared)
    except SchemaMismatch as exc:
        if plan.strategy != "cdc":
            raise
        column = exc.context.get("column")
        exc.hint = (
            "the stream holds changes made before an ALTER TABLE changed the type of "
            f"{column!r}, and one capture cannot land the column in both types (each retry "
            "reads the same changes): take a new snapshot (`combined cdc teardown`, then "
            f"`combined cdc setup`), or leave {column!r} out of the dataset's `columns:`; "
            "nothing was committed for this dataset"
        )
        raise


def _check_key_columns(plan: DatasetPlan, names: Sequence[str]) -> None:
    """Refuse a batch without a column of the key: no record read gave it a value (an API
    that leaves the field out or null), and no row could be given an id."""
    missing = [k for k in plan.key if k not in names]
    if missing:
        raise SchemaMismatch(
            f"the records of {plan.source}.{plan.name} hold no value of {missing[0]!r}, a "
            f"column of its key ({', '.join(plan.key)}): no row can be given an id",
            hint="check `key:` against the fields the source gives (`combined discover`): "
            "every record must carry a value of each key column; nothing was committed "
            "for this dataset",
            dataset=f"{plan.source}.{plan.name}",
            column=missing[0],
        )


def empty_schema(
    committed: pa.Schema | None,
    declared: Mapping[str, str] | None,
    read: pa.Schema | None = None,
) -> pa.Schema:
    # An empty read has no batch to take a schema from: the lake's, else the
    # discovered one, else the one the read gives for no row (a files read's
    # declared columns).
    if committed is not None:
        return pa.schema([f for f in committed if not f.name.startswith("_combined_")])
    if declared is None and read is not None:
        return read
    return pa.schema([pa.field(n, parse_type(t)) for n, t in (declared or {}).items()])


def _check_empty_key(plan: DatasetPlan, schema: pa.Schema) -> None:
    """Refuse a first capture that read no row and knows no type of a key column."""
    missing = [k for k in plan.key if k not in schema.names]
    if missing:
        raise SourceError(
            f"{plan.source}.{plan.name} read no row and nothing gives its columns' types "
            f"yet, so its key column {missing[0]!r} has none: nothing was committed",
            hint="declare the columns' types in the source's configuration (files: "
            "`columns:` under the file set), or capture once the source holds a row",
            dataset=f"{plan.source}.{plan.name}",
            column=missing[0],
        )


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
