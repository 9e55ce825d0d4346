"""Decoded row changes of one relation into bounded Arrow record batches.

See :mod:`~combined.connectors.postgres._cdc` for what the batches mean to
the engine (ops, truncate markers, ``_combined_unchanged``).
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import cast

import numpy as np
import pyarrow as pa

from combined.connectors.postgres._pgoutput import (
    Delete,
    Insert,
    Relation,
    RowChange,
    TupleData,
    Update,
    arrow_type,
    decode_message,
    lsn_to_text,
    text_to_arrow,
)
from combined.connectors.postgres._tuples import encode_tuple, join_messages, parse_joined
from combined.errors import ProtocolViolation, SchemaMismatch
from combined.protocol import EMITTED_AT_COLUMN, OP_COLUMN, POSITION_COLUMN

__all__ = [
    "CHANGE_COLUMNS",
    "NOT_WIRE",
    "OP_TRUNCATE",
    "UNCHANGED_COLUMN",
    "ChangeBatcher",
    "wire_ops",
]


#: The op of the one-row marker batch that states a TRUNCATE of the relation.
OP_TRUNCATE = "truncate"
#: Per row, the columns whose TOAST value an update left unchanged (and that
#: the batch therefore holds as null): the lake keeps its value for them.
UNCHANGED_COLUMN = "_combined_unchanged"
#: The control columns every change batch carries after the relation's columns.
CHANGE_COLUMNS = (OP_COLUMN, EMITTED_AT_COLUMN, POSITION_COLUMN, UNCHANGED_COLUMN)

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A row's operation, one byte a row: a delete that moved a row to another key
# (``_MOVED``) names the values the update left unchanged, as an update does.
_INSERT, _UPDATE, _DELETE, _MOVED = 0, 1, 2, 3
_OP_NAMES = pa.array(["insert", "update", "delete", "delete"], pa.string())
_UNCHANGED_KIND = b"u"[0]
_EMITTED_TYPE = pa.timestamp("us", tz="UTC")
#: What a parsed column's wire values are replaced by once converted.
_RELEASED = pa.array([], pa.binary())
#: A row change kept as its bytes, by its tag and the tuple marker after the
#: relation oid (bytes 0 and 5): an insert, an update without its old row, a delete.
_WIRE_OPS = {b"IN": _INSERT, b"UN": _UPDATE, b"DK": _DELETE, b"DO": _DELETE}
#: :func:`wire_ops` of a row change that is decoded, not kept as its bytes.
NOT_WIRE = 255
#: A row's bytes in the control columns beyond their text: the op's and the
#: position's offsets, the commit time, the unchanged list's offset.
_CONTROL_BYTES = 20


def _fixed_width(type_: pa.DataType) -> int:
    """The bytes a value of ``type_`` takes in a batch besides its data: its width, or
    its offset when it has none (strings, lists)."""
    try:
        return max(int(type_.bit_width) // 8, 1)
    except ValueError:  # (no fixed width)
        return 4


def wire_ops(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The op of each row change at offsets ``at`` of ``raw`` that is kept as its bytes,
    :data:`NOT_WIRE` for the others (an update that sent its old row)."""
    tag, marker = raw[at], raw[at + 5]
    ops = np.full(len(at), NOT_WIRE, np.uint8)
    ops[(tag == ord("I")) & (marker == ord("N"))] = _INSERT
    ops[(tag == ord("U")) & (marker == ord("N"))] = _UPDATE
    ops[(tag == ord("D")) & ((marker == ord("K")) | (marker == ord("O")))] = _DELETE
    return ops


class ChangeBatcher:
    """Collect the row changes of one relation into bounded Arrow record batches.

    Values are kept per column in their wire form and converted one column
    at a time when the batch is built (``pyarrow.compute`` casts of the text
    form), so memory is bounded by ``batch_rows`` and ``batch_bytes``, never
    by the size of a transaction. Rows keep log order; the caller flushes when
    :attr:`full` is true and at the boundaries it needs (commit, truncate,
    relation change).

    The batch holds the relation's columns, then ``_combined_op``
    (``insert``/``update``/``delete``), ``_combined_emitted_at`` (commit
    time), ``_combined_source_position`` (commit LSN as text) and
    ``_combined_unchanged``. An update that leaves a TOAST value unchanged
    carries null in that column and names it in ``_combined_unchanged``: the
    value was not sent and must not overwrite the lake's. When the old row is
    sent whole (``REPLICA IDENTITY FULL``) the value is taken from it instead.
    A delete carries the replica identity columns; the others are null. An
    update that changes the key is a delete of the old key followed by an
    insert of the new one (an update when it left values unchanged, which
    the delete names). ``key`` names the dataset's key columns: with it,
    an update whose old row was sent (a changed replica identity, or every
    update under ``REPLICA IDENTITY FULL``) is such a pair exactly when a key
    value differs; without it, only a changed replica identity is.

    ``type_overrides`` maps a user-defined type OID to the built-in OID to
    read it as (an enum as ``text``, a domain as its base type). ``columns``,
    when given, are the columns the batches hold (the dataset's ``columns:``
    and its key): the others are parsed past, never converted.
    """

    def __init__(
        self,
        relation: Relation,
        *,
        batch_rows: int = 65_536,
        batch_bytes: int = 64 << 20,
        type_overrides: Mapping[int, tuple[int, int]] | None = None,
        key: tuple[str, ...] | None = None,
        columns: Collection[str] | None = None,
    ) -> None:
        if batch_rows < 1 or batch_bytes < 1:
            raise ProtocolViolation("batch limits must be positive", hint="pass batch_rows >= 1")
        self.relation = relation
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        overrides = type_overrides or {}
        self._names = tuple(c.name for c in relation.columns)
        #: Positions of the columns the batches hold.
        self._kept = tuple(
            i for i, c in enumerate(relation.columns) if columns is None or c.name in columns
        )
        types = []
        for c in (relation.columns[i] for i in self._kept):
            oid, mod = overrides.get(c.type_oid, (c.type_oid, c.type_modifier))
            types.append(arrow_type(oid, mod if mod >= 0 else c.type_modifier, column=c.name))
        self._types = tuple(types)
        #: What a row weighs in the batch beyond its wire bytes: each column's fixed
        #: width (or offset) and the control columns'. A row of 300 null columns is
        #: 300 wire bytes and ~2,700 of Arrow: by wire bytes alone, a 16 MB batch
        #: of them was 61 MB of Arrow, staged and scanned whole.
        self._row_cost = sum(map(_fixed_width, types)) + _CONTROL_BYTES
        kept_names = [self._names[i] for i in self._kept]
        #: Positions of the dataset's key columns (None: the key is not known here).
        self._key_at = (
            tuple(self._names.index(k) for k in key)
            if key and all(k in self._names for k in key)
            else None
        )
        fields = [pa.field(n, t) for n, t in zip(kept_names, self._types, strict=True)]
        fields += [
            pa.field(OP_COLUMN, pa.string(), nullable=False),
            pa.field(EMITTED_AT_COLUMN, _EMITTED_TYPE),
            pa.field(POSITION_COLUMN, pa.string()),
            pa.field(UNCHANGED_COLUMN, pa.list_(pa.string())),
        ]
        self.schema = pa.schema(fields)
        self._reset()

    def _reset(self) -> None:
        # Each row as the wire states it: a message (or an encoded row) and
        # where its tuple starts, parsed into columns once per batch (numpy,
        # see _tuples), never value by value in Python.
        self._messages: list[bytes] = []
        self._starts = array("q")
        self._ops = bytearray()
        #: (first row, commit time in microseconds, commit LSN text) of each commit's rows.
        self._runs: list[tuple[int, int, str]] = []
        self._bytes = 0
        self._time_key: datetime | None = None
        self._lsn_key = -1

    @property
    def rows(self) -> int:
        """Rows collected since the last flush."""
        return len(self._ops)

    @property
    def nbytes(self) -> int:
        """What the rows collected since the last flush weigh: their wire bytes, and
        each row's fixed widths (the batch's Arrow is about as large)."""
        return self._bytes

    @property
    def full(self) -> bool:
        """Whether a row or byte limit is reached and the batch should be flushed."""
        return len(self._ops) >= self.batch_rows or self._bytes >= self.batch_bytes

    def add_wire(self, data: bytes, *, commit_lsn: int, commit_time: datetime) -> bool:
        """Append the row change of pgoutput message ``data`` (``I``, ``U`` or ``D``).

        An insert, a delete and an update that sent no old row are kept as
        their bytes; an update with its old row is decoded here (its key may
        have moved, its unchanged values may be in the old row). Returns
        :attr:`full`. Runs of row changes take :meth:`add_wires` instead.
        """
        op = _WIRE_OPS.get(data[0:6:5])  # the tag and the tuple marker after the oid
        if op is None:
            change = cast(RowChange, decode_message(data))
            # Routed here by its oid: a partition's row (its table's column order) is the table's.
            change.relation_oid = self.relation.oid
            self.add(change, commit_lsn=commit_lsn, commit_time=commit_time)
        else:
            self._push(data, 6, op, commit_lsn, commit_time)
        return self.full

    def add_wires(
        self,
        rows: Sequence[bytes],
        sizes: np.ndarray,
        ops: np.ndarray,
        *,
        commit_lsn: int,
        commit_time: datetime,
    ) -> int:
        """Append the first of ``rows`` until the batch is full; return how many.

        Each row is an insert, an update without its old row or a delete
        (:func:`wire_ops` of them is ``ops``), ``sizes`` their lengths.
        :meth:`add_wire` of each of them, without a Python round a row; the row
        that makes the batch full is the last one taken, as there.
        """
        k = min(len(rows), max(self.batch_rows - len(self._ops), 1))
        tuple_bytes = np.cumsum(sizes[:k] + (self._row_cost - 6))
        room = self.batch_bytes - self._bytes
        if tuple_bytes[-1] >= room:
            k = int(np.searchsorted(tuple_bytes, room, side="left")) + 1
        if commit_lsn != self._lsn_key or commit_time is not self._time_key:
            self._new_run(commit_lsn, commit_time)
        taken = rows[:k] if len(rows) > k else rows
        self._messages += taken
        self._starts.extend(repeat(6, k))
        self._ops += ops[:k].tobytes()
        self._bytes += int(tuple_bytes[k - 1])
        return k

    def add(self, change: RowChange, *, commit_lsn: int, commit_time: datetime) -> None:
        """Append one decoded row change of this relation."""
        if change.relation_oid != self.relation.oid:
            raise ProtocolViolation(
                f"change for relation oid {change.relation_oid} given to the batcher of "
                f"{self.relation.qualified_name}",
                hint="route changes by relation oid",
            )
        if isinstance(change, Insert):
            self._row(change.new, _INSERT, commit_lsn, commit_time)
        elif isinstance(change, Delete):
            self._row(change.old, _DELETE, commit_lsn, commit_time)
        else:
            self._update(change, commit_lsn, commit_time)

    def _update(self, change: Update, commit_lsn: int, commit_time: datetime) -> None:
        new, old = change.new, change.old
        unchanged: list[int] = []
        if "u" in new.kinds:
            kinds, values = list(new.kinds), list(new.values)
            for i, kind in enumerate(new.kinds):
                if kind != "u":
                    continue
                if old is not None and old.kinds[i] in "tb":
                    # The old row (``O``) or key (``K``: PostgreSQL sends it when a key
                    # value is stored out of line, as it then is in the new row) holds it.
                    kinds[i], values[i] = old.kinds[i], old.values[i]
                else:
                    unchanged.append(i)
            new = TupleData("".join(kinds), tuple(values))
        if old is not None and self._key_changed(change.old_kind, old, new):
            # The old key's row is gone. When the update left values unchanged,
            # the delete names them: they move with the row, from its old key.
            marks = set(unchanged)
            moved = TupleData(
                "".join(
                    "u" if i in marks else ("n" if k == "u" else k) for i, k in enumerate(old.kinds)
                ),
                old.values,
            )
            self._row(moved, _MOVED if unchanged else _DELETE, commit_lsn, commit_time)
            if not unchanged:
                # A row the new key did not hold: an insert, which the
                # duplicate check counts (a key with repeats, a deferrable
                # key a statement shifts through its own rows).
                self._row(new, _INSERT, commit_lsn, commit_time)
                return
        self._row(new, _UPDATE, commit_lsn, commit_time)

    def _key_changed(self, old_kind: str | None, old: TupleData, new: TupleData) -> bool:
        """Whether an update whose old row was sent moves the row to another key.

        Under ``REPLICA IDENTITY FULL`` every update sends the whole old row
        (``O``), whether the key changed or not: only the key's values tell.
        """
        if self._key_at is None:
            return old_kind == "K"
        return any(
            new.kinds[i] != "u" and old.kinds[i] != "u" and old.values[i] != new.values[i]
            for i in self._key_at
        )

    def _row(self, row: TupleData, op: int, commit_lsn: int, commit_time: datetime) -> None:
        if len(row.kinds) != len(self._names):
            raise SchemaMismatch(
                f"a row of {self.relation.qualified_name} has {len(row.kinds)} columns, "
                f"its relation message {len(self._names)}",
                hint="restart the capture; the stream and its relation cache disagree",
            )
        self._push(encode_tuple(row), 0, op, commit_lsn, commit_time)

    def _push(
        self, data: bytes, start: int, op: int, commit_lsn: int, commit_time: datetime
    ) -> None:
        self._messages.append(data)
        self._starts.append(start)
        if commit_lsn != self._lsn_key or commit_time is not self._time_key:
            self._new_run(commit_lsn, commit_time)
        self._ops.append(op)
        self._bytes += len(data) - start + self._row_cost

    def _new_run(self, commit_lsn: int, commit_time: datetime) -> None:
        """The rows from here on are another commit's."""
        self._lsn_key, self._time_key = commit_lsn, commit_time
        micros = (commit_time - _UNIX_EPOCH) // timedelta(microseconds=1)
        self._runs.append((len(self._ops), micros, lsn_to_text(commit_lsn)))

    def flush(self) -> pa.RecordBatch | None:
        """Build the collected rows into one record batch (``None`` when empty)."""
        if not self._ops:
            return None
        n = len(self._ops)
        # (the rows' bytes held once: joined, the messages let go, each
        # column's wire values let go once converted; a batch of wide rows
        # held them three times over at its peak)
        joined = join_messages(self._messages)
        self._messages = []
        parsed = parse_joined(joined, self._starts, len(self._names), self.relation.qualified_name)
        del joined
        arrays = []
        for i, type_ in zip(self._kept, self._types, strict=True):
            arrays.append(text_to_arrow(parsed.columns[i], type_, self._names[i]))
            parsed.columns[i] = _RELEASED
        ops = np.frombuffer(bytes(self._ops), np.uint8)
        firsts = [r[0] for r in self._runs]
        counts: np.ndarray = np.diff(np.array([*firsts, n], np.int64))
        runs = np.repeat(np.arange(len(firsts)), counts.astype(np.int64))
        emitted = pa.array([r[1] for r in self._runs], pa.int64()).take(runs)
        arrays += [
            _OP_NAMES.take(pa.array(ops)),
            emitted.cast(_EMITTED_TYPE),
            pa.array([r[2] for r in self._runs], pa.string()).take(runs),
            self._unchanged(parsed.kinds, (ops == _UPDATE) | (ops == _MOVED)),
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _unchanged(self, kinds: np.ndarray, marked: np.ndarray) -> pa.Array:
        """Per row, the names of its columns left unchanged (null when none, or not an update)."""
        kept = list(self._kept)
        if len(kept) < len(self._names):  # else every column: no copy of the kinds
            kinds = kinds[:, kept]
        marks = (kinds == _UNCHANGED_KIND) & marked[:, None]
        counts = marks.sum(axis=1)
        _, columns = np.nonzero(marks)  # row by row, columns in order
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        held = pa.array([self._names[i] for i in kept], pa.string())
        names = held.take(pa.array(columns, pa.int64()))
        return pa.ListArray.from_arrays(
            pa.array(offsets), names, type=pa.list_(pa.string()), mask=pa.array(counts == 0)
        )

    def truncate_batch(self, *, commit_lsn: int, commit_time: datetime) -> pa.RecordBatch:
        """The one-row marker batch of a TRUNCATE: op ``truncate``, every column null.

        Flush the rows collected before it first: the marker's place in the
        order of batches is the place of the truncate in the log.
        """
        n = len(self._types)
        arrays = [pa.nulls(1, t) for t in self._types]
        micros = (commit_time - _UNIX_EPOCH) // timedelta(microseconds=1)
        arrays += [
            pa.array([OP_TRUNCATE], pa.string()),
            pa.array([micros], pa.int64()).cast(_EMITTED_TYPE),
            pa.array([lsn_to_text(commit_lsn)], pa.string()),
            pa.nulls(1, pa.list_(pa.string())),
        ]
        assert len(arrays) == n + len(CHANGE_COLUMNS)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
