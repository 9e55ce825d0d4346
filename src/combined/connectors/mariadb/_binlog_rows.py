"""Binlog row images into bounded Arrow change batches, typed as the snapshot types them.

``mysql-replication`` decodes each row image into Python values. They are
written back as the text the server writes for the column (the form
:mod:`~combined.connectors.mariadb._types` parses), so that a change batch
converts through the same :class:`~._types.Layout` as a snapshot read and a
column has one Arrow type whichever way its rows arrived.

A batch holds the table's columns as the catalog has them when the read
starts (a column the log names but the table no longer has is left out; a
column the table has but an older row image lacks is absent from that
batch, and the engine adds it from the batch that first carries it), then
``_combined_op`` (``insert``/``update``/``delete``, or ``truncate`` for the
one-row marker of a ``TRUNCATE``), ``_combined_emitted_at`` (the event's
time) and ``_combined_source_position`` (``file:position`` of the event's
end). Rows keep log order; an update that changes the key is the old key's
delete followed by the new key's insert.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
import zlib
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from combined.connectors.mariadb._binlog_setup import RESNAPSHOT
from combined.connectors.mariadb._connect import ZeroDates
from combined.connectors.mariadb._types import ColumnPlan, Layout
from combined.errors import NeedsSnapshot, SchemaMismatch
from combined.protocol import EMITTED_AT_COLUMN, OP_COLUMN, POSITION_COLUMN

if TYPE_CHECKING:
    from combined.connectors.mariadb._binlog_decode import RowDecoder

OP_TRUNCATE = "truncate"
_EMITTED = pa.timestamp("us", tz="UTC")
#: Per row, the columns a filled row leaves as they were (``capture._unchanged``).
UNCHANGED = "_combined_unchanged"
_MARKS = pa.list_(pa.string())
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_ROW_IMAGE_FIX = (
    "SET GLOBAL binlog_row_image = 'FULL' on the server and set binlog_row_image=FULL in its "
    "configuration file; sessions opened before the change keep the old value, so reconnect "
    f"the writers, then take a new snapshot: {RESNAPSHOT}"
)


class Unreadable(str):
    """An ENUM or SET label of the log that nothing reads back (``_binlog_decode``).

    It stands in the column's labels, and a value that names it fails the
    read with :attr:`error`: a row that never names it reads as it should.
    """

    error: SchemaMismatch

    @classmethod
    def of(cls, error: SchemaMismatch) -> Unreadable:
        """A label whose use raises ``error``."""
        label = cls("")
        label.error = error
        return label


def refuse_unreadable(value: Any) -> None:
    """Raise the error of an :class:`Unreadable` label ``value`` is or holds (a SET's)."""
    if type(value) is Unreadable:
        raise value.error
    if isinstance(value, set | frozenset):
        for label in value:
            if type(label) is Unreadable:
                raise label.error


def server_text(value: Any, plan: ColumnPlan, column: Any = None) -> Any:
    """``value`` as decoded by ``mysql-replication``, written as the server writes it."""
    if value is None:
        return None
    refuse_unreadable(value)
    kind = plan.kind
    if kind == "binary":
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        if plan.source_type.lower().startswith("binary(") and plan.octets:
            return raw.ljust(plan.octets, b"\0")  # the log drops a BINARY(n)'s padding
        return raw
    if kind in ("bool", "bits"):
        return str(int(value, 2)) if isinstance(value, str) else str(int(value))
    if kind == "time" and isinstance(value, timedelta):
        return str((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, set | frozenset):
        order = list(getattr(column, "set_values", None) or sorted(value))
        return ",".join(v for v in order if v in value)
    if isinstance(value, bytes):
        return bytes_text(value, plan)
    if isinstance(value, dict | list):  # MySQL's binary JSON
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def bytes_text(value: bytes, plan: ColumnPlan) -> str:
    # The log drops the trailing zero bytes of these fixed-size binary values.
    source = plan.source_type.lower()
    if source in ("uuid", "inet6") and len(value) <= 16:
        value = value.ljust(16, b"\0")
        return str(uuid.UUID(bytes=value)) if source == "uuid" else inet6_text(value)
    if source == "inet4" and len(value) <= 4:
        return str(ipaddress.ip_address(value.ljust(4, b"\0")))
    return value.decode("utf-8", errors="replace")


def inet6_text(value: bytes) -> str:
    """An INET6 as the server writes it (``inet_ntop``): ``::1.2.3.4`` and ``::ffff:1.2.3.4``
    keep their IPv4 part dotted, where Python 3.11 writes ``::102:304``."""
    words = [int.from_bytes(value[i : i + 2], "big") for i in range(0, 16, 2)]
    zeros = next((n for n in range(8) if words[n]), 8)  # the leading run of zero words
    if zeros == 6 or (zeros == 5 and words[5] == 0xFFFF):
        return ("::ffff:" if zeros == 5 else "::") + str(ipaddress.IPv4Address(value[12:]))
    return str(ipaddress.IPv6Address(value))


def require_full_image(event: Any, relation: str) -> None:
    """Refuse a row image that leaves columns out (``binlog_row_image`` not FULL), or whose
    table map names no columns (logged while ``binlog_row_metadata`` was not FULL).

    Without names a row's values are only positions, which an ``ALTER TABLE``
    since may have moved: such a change failed as lacking the dataset's key
    column, with the hint to fix ``key:``.
    """
    table = event.table_map.get(event.table_id)
    if table is not None and any(c.name is None for c in table.columns):
        raise NeedsSnapshot(
            f"the binlog holds a change of {relation} logged while binlog_row_metadata was not "
            "FULL: its table map names no columns, so its values cannot be matched to "
            "columns faithfully",
            hint="SET GLOBAL binlog_row_metadata = 'FULL' on the server and set "
            "binlog_row_metadata=FULL in its configuration file, then take a new snapshot: "
            f"{RESNAPSHOT}",
            relation=relation,
        )
    total = int(event.number_of_columns)
    images = [event.columns_present_bitmap]
    if hasattr(event, "columns_present_bitmap2"):
        images.append(event.columns_present_bitmap2)
    for bitmap in images:
        present = bin(int.from_bytes(bytes(bitmap), "little")).count("1")
        if present < total:
            raise NeedsSnapshot(
                f"the binlog holds a partial row image of {relation} ({present} of {total} "
                "columns): the server or the writing session has binlog_row_image other "
                "than FULL, so the change cannot be applied faithfully",
                hint=_ROW_IMAGE_FIX,
                relation=relation,
            )


#: MariaDB's compressed events (``log_bin_compress=ON``): QUERY_COMPRESSED_EVENT
#: and the six compressed rows events. The reader cannot decode them, and a
#: compressed event may hold the table's changes or its TRUNCATE.
_COMPRESSED_EVENTS = frozenset(range(165, 172))
#: Of those, the rows events (WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT and _V1):
#: their post-header, uncompressed, names their table as any rows event's does.
_COMPRESSED_ROWS = frozenset(range(166, 172))


#: MariaDB's GTID flag of a group that ends in ``XA PREPARE`` (FL_PREPARED_XA).
PREPARED_XA = 64


def refuse_prepared_xa(name: str, here: str) -> None:
    """Fail the read at a row of a two-phase XA transaction.

    Its rows are logged when it is prepared; whether it committed is only a
    later ``XA COMMIT`` or ``XA ROLLBACK`` statement, possibly after other
    transactions or in a later capture. Read as they came, a rolled-back
    transaction's rows landed in the lake.
    """
    raise NeedsSnapshot(
        f"the binary log holds a change of {name} at {here} made by a prepared XA transaction "
        "(XA START ... XA PREPARE): its rows are logged before it commits or rolls back, so "
        "they may never have happened",
        hint="capture the table with the snapshot or cursor strategy, or have its writers "
        "commit without two-phase XA (XA COMMIT ... ONE PHASE is a plain commit); "
        f"then {RESNAPSHOT}",
    )


def refuse_compressed(event: Any, table: tuple[str, str], name: str, here: str) -> None:
    """Fail the read at a compressed event that may change ``table`` (schema, name): its
    changes would otherwise be skipped unseen. Another table's compressed rows event is
    skipped as its uncompressed one is (a compressed statement the read decodes first:
    :func:`compressed_query`; one it cannot is refused)."""
    if event.event_type in _COMPRESSED_ROWS and _rows_table(event) != table:
        return
    if event.event_type in _COMPRESSED_EVENTS:
        raise NeedsSnapshot(
            f"the binary log holds a compressed event at {here} (log_bin_compress=ON), which "
            f"the read of {name} cannot decode: its changes would be lost",
            hint=f"SET GLOBAL log_bin_compress = OFF on the server, then {RESNAPSHOT}",
        )


#: MariaDB's QUERY_COMPRESSED_EVENT, and the length of a query event's post-header.
_COMPRESSED_QUERY = 165
_QUERY_HEADER = 13


class CompressedQuery:
    """A QUERY_COMPRESSED_EVENT's statement, decompressed: what the read takes from a
    QueryEvent (its ``query``, ``schema`` and ``timestamp``)."""

    def __init__(self, query: str, schema: bytes, timestamp: int) -> None:
        self.query, self.schema, self.timestamp = query, schema, timestamp


def compressed_query(event: Any) -> CompressedQuery | None:
    """The statement of a compressed query event (``log_bin_compress=ON``), or None for any
    other event (or one whose compression is not zlib: :func:`refuse_compressed` fails it).

    Its post-header and status variables are a query event's; its statement
    is MariaDB's compressed buffer: a byte ``0x80 | algorithm << 4 | n``
    (algorithm 0: zlib), ``n`` bytes of the statement's length, then the zlib
    stream (the event's checksum after it is left over). Every capture failed
    at another table's compressed statement, though it changed nothing read.
    """
    if event.event_type != _COMPRESSED_QUERY:
        return None
    body = bytes(event.packet.get_all_data()[20:])  # (after the OK byte and common header)
    schema_len, vars_len = body[8], int.from_bytes(body[11:13], "little")
    at = _QUERY_HEADER + vars_len
    schema, packed = body[at : at + schema_len], body[at + schema_len + 1 :]
    if not packed or packed[0] & 0xF0 != 0x80:  # not zlib, or not compressed
        return None
    stream = zlib.decompressobj()
    try:
        query = stream.decompress(packed[1 + (packed[0] & 0x07) :])
    except zlib.error:
        return None
    if not stream.eof:
        return None
    return CompressedQuery(query.decode("utf-8", "replace"), schema, event.timestamp)


def _rows_table(event: Any) -> tuple[str, str] | None:
    """The (schema, name) of the table a compressed rows event changes, or None for a table
    the read does not follow.

    Its table id is the first 6 bytes of its post-header (after the packet's OK byte and the
    19-byte common header), as in an uncompressed rows event; the TABLE_MAP event before it
    maps that id. The reader keeps the maps of the followed table alone (it filters the
    others' before they reach the read), so an id it did not map is another table's.
    """
    table_id = int.from_bytes(bytes(event.packet.get_all_data()[20:26]), "little")
    mapped = event.table_map.get(table_id)
    return None if mapped is None else (str(mapped.schema), str(mapped.table))


class ChangeRows:
    """Collect the row changes of one table into bounded Arrow batches.

    ``plans`` are the table's columns (the catalog's, at the read's start),
    and ``vanished`` those of them it no longer has (a checkpoint's record).
    Rows are kept as server text per column and converted a batch at a
    time, so memory is bounded by ``batch_rows`` and ``batch_bytes``, never
    by a transaction. A batch holds the columns of one row image shape:
    :meth:`add` flushes before a row whose columns differ from the pending
    ones. The caller flushes when :attr:`full` is true and at the
    boundaries it needs.
    """

    def __init__(
        self,
        plans: Sequence[ColumnPlan],
        dataset: str,
        *,
        key: Sequence[str],
        batch_rows: int,
        batch_bytes: int,
        zero_dates: ZeroDates = "error",
        vanished: Collection[str] = (),
    ) -> None:
        self._plans = {p.name: p for p in plans}
        #: Columns the table no longer has: read from the row images that still name them.
        self._vanished = frozenset(vanished)
        self._zero_dates = zero_dates
        self._dataset = dataset
        self._key = tuple(key)
        self._limits = (max(1, batch_rows), max(1, batch_bytes))
        self._layout: Layout | None = None
        self._rows: list[Sequence[Any]] = []
        self._ops: list[str] = []
        self._at: list[datetime | int] = []  # a decoded row's: microseconds since the epoch
        self._pos: list[str] = []
        self._bytes = 0
        #: The decoder of the pending rows when they came decoded from the event's bytes.
        self._decoder: RowDecoder | None = None
        #: Whether batches carry ``_combined_unchanged`` (from the first filled row on).
        self._marks = False
        #: Columns earlier fills of the read gave the rows (a later fill keeps them).
        self._filled: set[str] = set()

    @property
    def plans(self) -> Mapping[str, ColumnPlan]:
        """The table's columns by name (the catalog's, at the read's start)."""
        return self._plans

    def learn(self, plans: Sequence[ColumnPlan]) -> None:
        """Take the plans of columns added to the table since (the known ones kept)."""
        self._plans.update({p.name: p for p in plans if p.name not in self._plans})

    def _present(self) -> list[str]:
        """The names of the table's columns (those it no longer has left out)."""
        return [n for n in self._plans if n not in self._vanished]

    @property
    def pending(self) -> int:
        """Rows collected and not yet flushed."""
        return len(self._rows)

    @property
    def full(self) -> bool:
        """Whether the pending rows reached a batch limit."""
        return len(self._rows) >= self._limits[0] or self._bytes >= self._limits[1]

    @property
    def due(self) -> bool:
        """Whether the pending rows reached half a batch limit: at a transaction's end, the
        read flushes them then; below, the next transactions' rows join them."""
        return 2 * len(self._rows) >= self._limits[0] or 2 * self._bytes >= self._limits[1]

    def _shape(self, names: Sequence[str]) -> Layout:
        kept = [self._plans[n] for n in names if n in self._plans]
        missing = [k for k in self._key if k not in {p.name for p in kept}]
        if missing:
            raise NeedsSnapshot(
                f"a binlog row image of dataset {self._dataset} lacks key column {missing[0]!r}",
                hint="the key must be a column of the table; fix `key:`, then take a new "
                f"snapshot: {RESNAPSHOT}",
            )
        return Layout.of(kept)

    def add(
        self,
        op: str,
        values: Mapping[str, Any],
        columns: Sequence[Any],
        at: datetime,
        position: str,
        nones: Mapping[str, str] | None = None,
    ) -> list[pa.RecordBatch]:
        """Add one row change; returns the batch flushed first when the shape changed.

        ``nones`` says why the library decoded a value as None: an empty SET
        is the empty text, a zero date follows the ``zero_dates`` policy.
        """
        if nones:
            values = self._resolve_nones(values, nones)
        names = [str(c.name) for c in columns]
        flushed: list[pa.RecordBatch] = []
        if (
            self._layout is None
            or self._decoder is not None
            or [p.name for p in self._layout.plans] != [n for n in names if n in self._plans]
        ):
            flushed = self.flush()
            self._layout, self._decoder = self._shape(names), None
        by_name = {str(c.name): c for c in columns}
        row = [server_text(values.get(p.name), p, by_name.get(p.name)) for p in self._layout.plans]
        self._rows.append(row)
        self._ops.append(op)
        self._at.append(at)
        self._pos.append(position)
        self._bytes += sum(len(v) for v in row if isinstance(v, str | bytes)) + 16
        return flushed

    def add_decoded(
        self,
        decoder: RowDecoder,
        ops: Sequence[str],
        rows: Sequence[Sequence[Any]],
        at: datetime,
        position: str,
        nbytes: int,
    ) -> list[pa.RecordBatch]:
        """Add the rows of one event decoded by ``decoder``; returns the batches they filled.

        ``nbytes`` is the event's size, shared by its rows for the byte limit.
        """
        flushed: list[pa.RecordBatch] = []
        if self._decoder is not decoder or self._layout is None:
            flushed = self.flush()
            self._layout, self._decoder = self._shape(decoder.names), decoder
        each = max(1, nbytes // max(1, len(rows)))
        stamp = (at - _EPOCH) // _MICROSECOND  # an int converts faster than a datetime
        done = 0
        while done < len(rows):
            room = min(
                self._limits[0] - len(self._rows), -(-(self._limits[1] - self._bytes) // each)
            )
            end = done + max(1, room)
            taken = len(rows[done:end])
            self._rows.extend(rows[done:end])
            self._ops.extend(ops[done:end])
            self._at.extend([stamp] * taken)
            self._pos.extend([position] * taken)
            self._bytes += each * taken
            done = end
            if self.full:
                flushed += self.flush()
        return flushed

    def _resolve_nones(self, values: Mapping[str, Any], nones: Mapping[str, str]) -> dict[str, Any]:
        out = dict(values)
        for name, why in nones.items():
            if why == "empty set":
                out[name] = ""
            elif why.startswith("out of date") and self._zero_dates != "null":
                plan = self._plans.get(name)
                raise SchemaMismatch(
                    f"column {name!r} ({plan.source_type if plan else '?'}) of dataset "
                    f"{self._dataset!r} holds a zero date in the binlog, which is not a date",
                    hint="set zero_dates: null to read zero dates as nulls",
                    dataset=self._dataset,
                    column=name,
                )
        return out

    def fill(
        self, read: pa.RecordBatch, added: Sequence[str], at: datetime, position: str
    ) -> pa.RecordBatch:
        """Rows read from the source as updates of their columns alone (the rest unchanged).

        The batch holds the columns of the rows before it, those earlier fills
        gave them, plus ``added`` (all of the table's when no row came before),
        each column ``read`` lacks as null and named in ``_combined_unchanged``:
        the engine fills it from the row's earlier change in the capture, else
        from the lake. (A second fill with no row between left the first
        one's columns out of its batch: null on every row.)
        """
        # No row before: every column the read planned, the dropped ones too (the fill is
        # logged before their drop; left out, they landed null on every filled row).
        before = {p.name for p in self._layout.plans} if self._layout else set(self._plans)
        before |= self._filled
        self._filled.update(added)
        plans = [p for p in self._plans.values() if p.name in before or p.name in added]
        schema = Layout.of(plans).schema
        n = read.num_rows
        columns = [
            read.column(f.name).cast(f.type) if f.name in read.schema.names else pa.nulls(n, f.type)
            for f in schema
        ]
        unchanged = [f.name for f in schema if f.name not in read.schema.names]
        self._marks = True
        marks = pa.array([unchanged] * n, pa.list_(pa.string()))
        ops, pos = ["update"] * n, [position] * n
        return self._batch(schema, columns, ops, [at] * n, pos, marks)

    def truncate(self, at: datetime, position: str) -> list[pa.RecordBatch]:
        """The pending rows, then the one-row marker that empties the table at this point.

        With no row before it, the marker names the table's columns; when the table is
        gone (every column :attr:`_vanished`: the read goes up to its DROP or RENAME with
        the columns the checkpoint recorded), those recorded, its key among them: a marker
        without the key was refused by the engine, and the TRUNCATE never committed.
        """
        out = self.flush()
        names = self._present()
        if not set(self._key) <= set(names):
            names = list(self._plans)
        layout = self._layout or Layout.of([self._plans[n] for n in names])
        marker = [None] * len(layout.plans)
        out.append(self._build(layout, [marker], [OP_TRUNCATE], [at], [position]))
        return out

    def flush(self) -> list[pa.RecordBatch]:
        """The pending rows as one batch (none when nothing is pending)."""
        if not self._rows or self._layout is None:
            return []
        if self._decoder is not None:
            data = self._decoder.arrays(self._rows, self._dataset, self._zero_dates)
            batch = self._batch(self._layout.schema, data, self._ops, self._at, self._pos)
        else:
            batch = self._build(self._layout, self._rows, self._ops, self._at, self._pos)
        self._rows, self._ops, self._at, self._pos, self._bytes = [], [], [], [], 0
        return [batch]

    def _build(
        self,
        layout: Layout,
        rows: Sequence[Sequence[Any]],
        ops: list[str],
        at: Sequence[datetime | int],
        pos: list[str],
    ) -> pa.RecordBatch:
        data = layout.convert(rows, self._dataset)
        return self._batch(data.schema, data.columns, ops, at, pos)

    def _batch(
        self,
        schema: pa.Schema,
        columns: Sequence[pa.Array],
        ops: list[str],
        at: Sequence[datetime | int],
        pos: list[str],
        marks: pa.Array | None = None,
    ) -> pa.RecordBatch:
        arrays = [
            *columns,
            pa.array(ops, pa.string()),
            pa.array(at, _EMITTED),
            pa.array(pos, pa.string()),
        ]
        fields = [
            *schema,
            pa.field(OP_COLUMN, pa.string(), nullable=False),
            pa.field(EMITTED_AT_COLUMN, _EMITTED),
            pa.field(POSITION_COLUMN, pa.string()),
        ]
        if self._marks:  # every batch after a fill names its unchanged columns (none)
            arrays.append(marks if marks is not None else pa.nulls(len(ops), _MARKS))
            fields.append(pa.field(UNCHANGED, _MARKS))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def event_time(timestamp: int) -> datetime:
    """An event header's time (whole seconds since the epoch) as UTC."""
    return datetime.fromtimestamp(int(timestamp), UTC)
