"""Partitioned backfills: one exported snapshot, partitions read in parallel.

The source plans the partitions inside one exported snapshot (bounds and
control totals resolved in it); each partition is read by its own session in
its own thread and staged in its own directory. The staged partitions are
one capture of the range: ids in the lake inside the range that the capture
does not hold are deletes, rows outside the range are untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from combined.connectors.abc import Extraction, PartitionedSource, ReadRequest, Source
from combined.delivery import PartWriter, StagingArea, part_schema
from combined.errors import ConfigError
from combined.lake import LakeLayout, lake_schema
from combined.protocol import (
    ExtractionReceipt,
    RecordBatchMessage,
    TerminalOutcome,
    TerminalReceipt,
)
from combined.protocol._digest import Digest, digest_of
from combined.protocol.identity import quote_ident
from combined.runtime._deadline import reading
from combined.runtime._drift import check_key, judge_drift
from combined.runtime._extract import empty_schema
from combined.runtime._plan import DatasetPlan, Staged, resumed_commit, table_of
from combined.runtime._reporter import Reporter
from combined.runtime._schema_check import check_batch
from combined.runtime._stage import CaptureStager

#: Ordinals of partition ``i`` start at ``i << PARTITION_SHIFT``: unique across partitions.
PARTITION_SHIFT = 40


@dataclass(frozen=True, slots=True)
class BackfillSpec:
    """What a backfill reads: a key or time range split into partitions."""

    partitions: int
    column: str | None = None
    lower: str | None = None
    upper: str | None = None
    sum_column: str | None = None


class PartitionGroup:
    """The partitions' extractions seen as one: one receipt, one terminal decision."""

    def __init__(self, extractions: Sequence[Extraction]) -> None:
        self.extractions = list(extractions)

    @property
    def receipt(self) -> ExtractionReceipt:
        """The union of the partitions' windows over their one snapshot."""
        receipts = [e.receipt for e in self.extractions]
        started = [r.extraction_started_at for r in receipts if r.extraction_started_at]
        done = [r.extraction_completed_at for r in receipts]
        first = receipts[0]
        return dataclasses.replace(
            first,
            extraction_started_at=min(started) if started else None,
            extraction_completed_at=max(d for d in done if d) if all(done) else None,
            rows=sum(r.rows for r in receipts),
            bytes=sum(r.bytes for r in receipts),
        )

    def acknowledge(self, state: Mapping[str, Any]) -> None:
        """Snapshot reads hold no position to confirm."""

    def finish(self, outcome: TerminalOutcome) -> TerminalReceipt:
        """Decide every partition; returns the first partition's receipt."""
        receipts = [e.finish(outcome) for e in self.extractions]
        return receipts[0]


def _duck_type(t: pa.DataType) -> str | None:
    """The DuckDB type that parses and orders a bound as the source does (None: none does)."""
    if pa.types.is_integer(t):
        return "BIGINT"
    if pa.types.is_decimal(t) and t.precision <= 38 and t.scale >= 0:
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_float32(t):
        return "FLOAT"  # '0.7' as a double lies above the real 0.7 the source compares
    if pa.types.is_float64(t):
        return "DOUBLE"
    return None


def _zoned(text: str) -> str:
    """A timestamp bound without a zone, in UTC: the source's session reads it so.

    DuckDB would read it in the process's local zone.
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return text  # not ISO 8601: DuckDB reads it as written or refuses it
    return value.replace(tzinfo=UTC).isoformat() if value.tzinfo is None else text


def range_filter(schema: pa.Schema | None, column: str, lower: Any, upper: Any) -> str | None:
    """SQL selecting ``lower <= column < upper`` in the lake (None: the whole table).

    The bounds are read as the source reads them, so that the lake's range
    is the source's. Raises :class:`~combined.errors.ConfigError` where the
    lake keeps the column as a type that does not compare in the source's
    order (a numeric without a precision, kept as text): ids of rows outside
    the source's range would be taken for deletes.
    """
    if schema is None or (lower is None and upper is None):
        return None
    kind = schema.field(column).type
    duck = _duck_type(kind)
    if duck is None:
        raise ConfigError(
            f"the lake keeps column {column!r} as {kind}, which does not compare in the "
            "source's order: a range over it cannot find the range's deletes in the lake",
            hint="backfill over another column (--column), or capture the whole table "
            "with `combined capture`",
            column=column,
        )
    col = quote_ident(column)
    parts = []
    for op, value in ((">=", lower), ("<", upper)):
        if value is not None:
            text = _zoned(str(value)) if duck == "TIMESTAMPTZ" else str(value)
            text = text.replace("'", "''")
            parts.append(f"{col} {op} CAST('{text}' AS {duck})")
    return " AND ".join(parts)


def check_backfill(
    name: str,
    connector: type[Source],
    declared: tuple[str, str, Sequence[str]],
    schema: pa.Schema | None,
    spec: BackfillSpec,
) -> str:
    """Refuse a backfill its dataset cannot take, before any Run; returns its column.

    ``declared`` is the dataset's (strategy, sync mode, key) and ``schema``
    the lake table's (None before a first capture). Every refusal is a
    :class:`~combined.errors.ConfigError` saying what to change.
    """
    strategy, sync_mode, key = declared
    if not connector.SUPPORTS_PARTITIONS:
        raise ConfigError(
            f"{name}: the {connector.name} connector cannot read partitions, so it takes "
            "no backfill",
            hint=f"capture the dataset with `combined capture {name}` instead",
        )
    if spec.partitions < 1:
        raise ConfigError("--partitions must be at least 1", hint="e.g. --partitions 4")
    if spec.lower is None or spec.upper is None:
        raise ConfigError(
            f"a backfill of {name} reads a range: --from and --to are both required",
            hint="e.g. --from 1 --to 1000000 (inclusive from, exclusive to); "
            f"`combined capture {name}` reads the whole dataset",
        )
    if strategy == "cdc":
        raise ConfigError(
            f"{name} is captured from its change stream",
            hint="its first capture (`combined cdc setup`) already reads the whole table",
        )
    if sync_mode in ("full_refresh", "append"):
        why = (
            "it would replace the whole table with the range"
            if sync_mode == "full_refresh"
            else "an append dataset keeps its event stream as it came; a backfill would repeat it"
        )
        raise ConfigError(
            f"{name} is {sync_mode}, which cannot be backfilled: {why}",
            hint=f"capture it with `combined capture {name}`",
        )
    if not key:
        # Its rows are told apart by their content and their number among
        # equal rows, which only the whole table gives.
        raise ConfigError(
            f"{name} has no key (key: []), so a range of it cannot be matched with the lake's rows",
            hint=f"capture it whole with `combined capture {name}`",
        )
    column = spec.column or key[0]
    if schema is not None and column in schema.names:
        range_filter(schema, column, spec.lower, spec.upper)  # a range the lake cannot match
    return column


def stage_partitioned(
    plan: DatasetPlan,
    source: Source,
    spec: BackfillSpec,
    area: StagingArea,
    layout: LakeLayout,
    reporter: Reporter,
    declared: Mapping[str, str] | None,
) -> Staged:
    """Plan, read every partition in parallel, and stage them as one capture of the range."""
    table = table_of(layout, plan).pinned()  # (one load for its six reads, as extract's)
    last = resumed_commit(layout, plan, table)
    check_key(plan, last, getattr(declared, "identity", None))
    reader, column = _partitioned(source, plan, table.schema(), spec)
    partitions = _Partitions(plan, area, reporter, declared, digest_of(table.schema()))
    # Absent ids are deletes only when the range is over the key (see below).
    current_filter = (
        range_filter(table.schema(), column, spec.lower, spec.upper) if column in plan.key else None
    )
    parts_plan = _plan_range(reader, plan, spec, column)
    try:
        group, results = partitions.read(reader, parts_plan)
        control = parts_plan.control
    finally:
        parts_plan.close()
    parts, schema = partitions.one_schema(results, table.schema())
    # The range meets the dataset's drift policy as any capture does, a rename
    # told by the columns' identities at the source included (and recorded).
    before = last.get("fields") if last else None
    now = getattr(declared, "identity", None) or before
    try:
        drift = judge_drift(plan, table.schema(), schema, parts, before, now)
    except BaseException:
        group.finish("abort")
        raise
    return Staged(
        plan=plan,
        extraction=group,  # type: ignore[arg-type]
        parts=parts,
        schema=schema,
        state=last.get("checkpoint") if last else None,
        position=last.get("source_position") if last else None,
        receipt=group.receipt,
        rows=sum(rows for _, rows in results),
        drift=drift,
        # Absent ids are deletes only when the range is over the key: a key value
        # never moves, so an id missing from a key range is gone. A range over a
        # changeable column (a timestamp) cannot tell a deleted row from one that
        # moved out of the range: such a backfill upserts and infers no delete.
        full=column in plan.key,
        prior_state=last.get("checkpoint") if last else None,
        fields=now,
        current_filter=current_filter,
        # What landed is counted over the same range, whatever its column.
        landed_filter=range_filter(lake_schema(schema), column, spec.lower, spec.upper),
        bounded=True,
        control={
            "column": column,
            "lower": spec.lower,
            "upper": spec.upper,
            "rows": control.rows,
            "sum_column": control.sum_column,
            "sum": control.sum,
        },
    )


def _partitioned(
    source: Source, plan: DatasetPlan, schema: pa.Schema | None, spec: BackfillSpec
) -> tuple[PartitionedSource, str]:
    """The source, once it reads partitions and the dataset takes the backfill; its column."""
    if not isinstance(source, PartitionedSource):
        raise ConfigError(
            f"the {type(source).name} connector cannot read partitions",
            hint="capture the dataset with `combined capture` instead",
        )
    column = check_backfill(
        f"{plan.source}.{plan.name}",
        type(source),
        (plan.strategy, plan.sync_mode, plan.key),
        schema,
        spec,
    )
    return source, column


def _plan_range(
    source: PartitionedSource, plan: DatasetPlan, spec: BackfillSpec, column: str
) -> Any:
    """The source's partitions of the range, planned in one exported snapshot."""
    request = ReadRequest(
        dataset=plan.name,
        relation=plan.relation,
        key=plan.key,
        strategy="snapshot",
        columns=plan.columns,
        batch_rows=plan.batch_rows,
    )
    return source.plan_partitions(
        request,
        spec.partitions,
        column=column,
        lower=spec.lower,
        upper=spec.upper,
        sum_column=spec.sum_column,
    )


class _Partitions:
    """A backfill's partitions read in parallel, each staged in its own directory."""

    def __init__(
        self,
        plan: DatasetPlan,
        area: StagingArea,
        reporter: Reporter,
        declared: Mapping[str, str] | None,
        digest: Digest,
    ) -> None:
        self.plan = plan
        self.area = area
        self.reporter = reporter
        self.declared = declared
        self.digest = digest
        self.progress: list[int] = []

    def read(
        self, source: PartitionedSource, parts_plan: Any
    ) -> tuple[PartitionGroup, list[tuple[list[Path], int]]]:
        """Every partition of ``parts_plan`` read, a thread each: the group, parts and rows."""
        count = len(parts_plan.partitions)
        extractions = [source.read_partition(parts_plan, i) for i in range(count)]
        group = PartitionGroup(extractions)
        self.progress = [0] * count
        with (
            reading(group),  # aborted if it fails; under the Attempt's deadline
            ThreadPoolExecutor(max_workers=count, thread_name_prefix="partition") as pool,
        ):
            results = list(pool.map(self._read_one, extractions, range(count)))
        return group, results

    def _read_one(self, extraction: Extraction, index: int) -> tuple[list[Path], int]:
        plan = self.plan
        writer = PartWriter(
            self.area,
            f"{plan.source}/{plan.name}/capture/p{index:04d}",
            max_rows=plan.max_rows,
            max_bytes=plan.max_bytes,
        )
        # The partitions share the machine's cores: one hashing thread each.
        stager = CaptureStager(
            writer,
            key=plan.key,
            hash_rows=True,
            first_ordinal=index << PARTITION_SHIFT,
            threads=1,
            digest=self.digest,
        )
        rows = 0
        schema: pa.Schema | None = None
        try:
            for msg in extraction:
                if not isinstance(msg, RecordBatchMessage):
                    continue
                batch = msg.batch
                check_batch(f"{plan.source}.{plan.name}", batch, self.declared)
                schema = schema or batch.schema
                stager.put(batch)
                rows += batch.num_rows
                self.progress[index] = rows
                self.reporter.progress(plan.name, sum(self.progress), 0, 0)
            if schema is None:  # an empty partition stages nothing
                stager.abort()
                return [], 0
            return stager.close(schema), rows
        except BaseException:
            stager.abort()
            raise

    def one_schema(
        self, results: list[tuple[list[Path], int]], lake: pa.Schema | None
    ) -> tuple[list[Path], pa.Schema]:
        """The partitions' parts and their one schema (an empty range's: the lake's)."""
        plan = self.plan
        parts = [p for paths, _ in results for p in paths]
        schemas = {part_schema(p) for p in parts}
        if len(schemas) > 1:
            # Every partition reads the same relation: different schemas mean a
            # partition handed over a value that does not fit.
            raise ConfigError(
                f"the partitions of {plan.source}.{plan.name} staged different schemas",
                hint="declare casts for the differing columns",
            )
        if not parts:  # an empty range is still a capture of it: stage its schema alone
            writer = PartWriter(
                self.area, f"{plan.source}/{plan.name}/capture/empty", plan.max_rows, plan.max_bytes
            )
            empty = CaptureStager(writer, key=plan.key, hash_rows=True, digest=self.digest)
            parts = empty.close(empty_schema(lake, self.declared))
            schemas = {part_schema(parts[0])}
        return parts, schemas.pop()
