"""Binlog row events decoded straight from their bytes into column values for Arrow.

``mysql-replication`` parses each event's header and the table map (the
column types, their metadata, names, charsets, ENUM and SET labels), but
decoding rows through it costs several Python calls per value and a dict per
row image. A :class:`RowDecoder`, built once per table shape, reads the body of
a ``WRITE``/``UPDATE``/``DELETE_ROWS`` event (v1 or v2, MariaDB's or MySQL's:
the library has already read the header and the column bitmaps) with one
precomputed reader per column: ``struct`` for fixed widths, a length prefix
for strings and blobs, exact digit groups for DECIMAL, the packed fields of
DATE, DATETIME2, TIMESTAMP2 and TIME2, the index of an ENUM, the mask of a
SET, the big-endian bits of BIT. Rows come out as lists in log order; a
flush turns their columns into Arrow arrays typed as
:mod:`~combined.connectors.mariadb._types` types a snapshot's.

Each value takes the form its Arrow conversion reads fastest: numbers as
Python numbers, DECIMAL as its unscaled integer (written into the decimal
array's buffer as is), TIMESTAMP as microseconds since the epoch, strings
decoded with the column's charset, DATE and DATETIME as the server's text
(cast by Arrow, zero dates judged as a snapshot judges them).

A table map with a column this module does not read (the pre-5.6 temporal
formats, the old DECIMAL, a column whose type changed since the catalog was
read, a label list the log lacks), or an event it cannot take the bytes of
(a partial JSON update), goes through the library, as before
(:func:`row_decoder` or :func:`event_body` returns ``None``).
"""

from __future__ import annotations

import codecs
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from combined.connectors.mariadb._binlog_charsets import column_encoding
from combined.connectors.mariadb._binlog_rows import (
    Unreadable,
    bytes_text,
    refuse_unreadable,
    server_text,
)
from combined.connectors.mariadb._connect import ZeroDates
from combined.connectors.mariadb._types import ColumnPlan, convert_column
from combined.errors import SchemaMismatch

#: One column's reader: the value at ``pos`` in ``buf``, and the position after it.
Reader = Callable[[bytes, int], tuple[Any, int]]

# Field types of the binlog's table map (MySQL's enum_field_types).
_TINY, _SHORT, _LONG, _FLOAT, _DOUBLE, _LONGLONG, _INT24 = 1, 2, 3, 4, 5, 8, 9
_DATE, _YEAR, _VARCHAR, _BIT = 10, 13, 15, 16
_TIMESTAMP2, _DATETIME2, _TIME2 = 17, 18, 19
_JSON, _NEWDECIMAL, _ENUM, _SET, _BLOB, _STRING, _GEOMETRY = 245, 246, 247, 248, 252, 254, 255
_PARTIAL_UPDATE_ROWS = 39
_INTS = {_TINY: ("b", 1), _SHORT: ("h", 2), _LONG: ("i", 4), _LONGLONG: ("q", 8)}
_DIGITS_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


class _Zero:
    """A zero TIMESTAMP (``0000-00-00 00:00:00``) read from the log, judged when built."""

    __slots__ = ()


_ZERO = _Zero()


def _fixed(fmt: str, size: int) -> Reader:
    unpack = struct.Struct("<" + fmt).unpack_from

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return read


def _int24(signed: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(buf[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _year(buf: bytes, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return (b + 1900 if b else 0), pos + 1


def _length_prefixed(size: int) -> Callable[[bytes, int], tuple[bytes, int]]:
    if size == 1:

        def read1(buf: bytes, pos: int) -> tuple[bytes, int]:
            end = pos + 1 + buf[pos]
            return buf[pos + 1 : end], end

        return read1
    if size == 2:
        unpack2 = struct.Struct("<H").unpack_from

        def read2(buf: bytes, pos: int) -> tuple[bytes, int]:
            end = pos + 2 + unpack2(buf, pos)[0]
            return buf[pos + 2 : end], end

        return read2

    def read(buf: bytes, pos: int) -> tuple[bytes, int]:
        start = pos + size
        end = start + int.from_bytes(buf[pos:start], "little")
        return buf[start:end], end

    return read


def _text(size: int, column: Any, plan: ColumnPlan) -> Reader:
    """A string column's reader: decoded as the library decodes it (its charset, strict)."""
    raw = _length_prefixed(size)
    encoding = column_encoding(column)
    if encoding is None:  # a binary charset: UUID, INET4/6, or bytes read as text

        def read_bytes(buf: bytes, pos: int) -> tuple[Any, int]:
            value, end = raw(buf, pos)
            return bytes_text(value, plan), end

        return read_bytes
    if size == 1:  # VARCHAR up to 255 bytes, TINYTEXT: the common case, in one call

        def read1(buf: bytes, pos: int) -> tuple[Any, int]:
            end = pos + 1 + buf[pos]
            return buf[pos + 1 : end].decode(encoding), end

        return read1

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        value, end = raw(buf, pos)
        return value.decode(encoding), end

    return read


def library_labels(columns: Sequence[Any], plans: Mapping[str, ColumnPlan]) -> None:
    """Give each ENUM and SET column of a table map the labels :func:`_logged_labels` reads.

    For the library's own per-value path (it names a value by these lists).
    Changes the columns in place; doing it again is a no-op.
    """
    for column in columns:
        plan = plans.get(str(column.name))
        if plan is None:
            continue
        if column.type == _ENUM and column.enum_values:
            column.enum_values = ["", *_column_labels(column, plan)]
        elif column.type == _SET and column.set_values:
            column.set_values = _column_labels(column, plan)


def _column_labels(column: Any, plan: ColumnPlan) -> list[str]:
    """:func:`_logged_labels` of a table map's ENUM or SET column, read once.

    Kept on the column: a table map's columns serve each of its rows
    events, and its labels, once read, are no longer the library's.
    """
    kept: list[str] | None = getattr(column, "_combined_labels", None)
    if kept is None:
        logged = column.enum_values[1:] if column.type == _ENUM else column.set_values
        kept = _logged_labels(column, plan, list(logged))
        column._combined_labels = kept
    return kept


def _binary(raw: Callable[[bytes, int], tuple[bytes, int]], plan: ColumnPlan) -> Reader:
    if not (plan.source_type.lower().startswith("binary(") and plan.octets):
        return raw
    width = plan.octets

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        value, end = raw(buf, pos)
        return value.ljust(width, b"\0"), end  # the log drops a BINARY(n)'s padding

    return read


def _decimal(precision: int, scale: int) -> Reader:
    """DECIMAL's binary form (digit groups of 9 in 4 bytes, big-endian, sign-flipped).

    The value is its unscaled integer (``-12.34`` in a DECIMAL(10,2) is -1234).
    """
    whole = precision - scale
    groups: list[tuple[int, int]] = []  # (bytes, decimal digits) of each field, in order
    if whole % 9:
        groups.append((_DIGITS_BYTES[whole % 9], whole % 9))
    groups += [(4, 9)] * (whole // 9) + [(4, 9)] * (scale // 9)
    if scale % 9:
        groups.append((_DIGITS_BYTES[scale % 9], scale % 9))
    size = sum(g[0] for g in groups)
    shifts = []
    left = size * 8
    for nbytes, digits in groups:
        left -= nbytes * 8
        shifts.append((left, (1 << (nbytes * 8)) - 1, 10**digits))
    everything = (1 << (size * 8)) - 1
    top = 1 << (size * 8 - 1)
    if len(shifts) == 3:  # DECIMAL(11..18, 1..8): unrolled
        (s1, m1, _), (s2, m2, u2), (s3, m3, u3) = shifts

        def read3(buf: bytes, pos: int) -> tuple[Any, int]:
            p = int.from_bytes(buf[pos : pos + size], "big")
            sign, p = (1, p ^ top) if p & top else (-1, p ^ everything ^ top)
            return sign * (
                (((p >> s1) & m1) * u2 + ((p >> s2) & m2)) * u3 + ((p >> s3) & m3)
            ), pos + size

        return read3

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        packed = int.from_bytes(buf[pos : pos + size], "big")
        sign, packed = (1, packed ^ top) if packed & top else (-1, packed ^ everything ^ top)
        number = 0
        for shift, mask, scale_up in shifts:
            number = number * scale_up + ((packed >> shift) & mask)
        return sign * number, pos + size

    return read


def _fraction(fsp: int) -> tuple[int, int]:
    """Bytes of a DATETIME2/TIMESTAMP2/TIME2 fraction, and its unit in microseconds."""
    nbytes = (fsp + 1) // 2
    return nbytes, 10 ** (6 - 2 * nbytes)


def _date(buf: bytes, pos: int) -> tuple[Any, int]:
    v = int.from_bytes(buf[pos : pos + 3], "little")
    return f"{v >> 9:04d}-{(v >> 5) & 15:02d}-{v & 31:02d}", pos + 3


def _datetime2(fsp: int) -> Reader:
    nbytes, unit = _fraction(fsp)
    size = 5 + nbytes

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(buf[pos : pos + 5], "big")
        frac = int.from_bytes(buf[pos + 5 : pos + size], "big") * unit if nbytes else 0
        ym = (v >> 22) & 0x1FFFF
        text = (
            f"{ym // 13:04d}-{ym % 13:02d}-{(v >> 17) & 31:02d} "
            f"{(v >> 12) & 31:02d}:{(v >> 6) & 63:02d}:{v & 63:02d}.{frac:06d}"
        )
        return text, pos + size

    return read


def _timestamp2(fsp: int) -> Reader:
    nbytes, unit = _fraction(fsp)
    size, bits = 4 + nbytes, nbytes * 8
    mask = (1 << bits) - 1

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(buf[pos : pos + size], "big")
        if not v:
            return _ZERO, pos + size
        return (v >> bits) * 1_000_000 + (v & mask) * unit, pos + size

    return read


def _time2(fsp: int) -> Reader:
    """TIME2 as microseconds (negative below zero): MySQL's packed, offset form."""
    nbytes, unit = _fraction(fsp)
    size = 3 + nbytes
    bits = nbytes * 8
    offset = 0x800000 << bits

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        packed = int.from_bytes(buf[pos : pos + size], "big") - offset
        sign, packed = (-1, -packed) if packed < 0 else (1, packed)
        hms, frac = packed >> bits, packed & ((1 << bits) - 1)
        seconds = ((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63)
        return str(sign * (seconds * 1_000_000 + frac * unit)), pos + size

    return read


#: The escapes of a label in a column type as the server writes it (``append_unescaped``).
_LABEL_ESCAPES = {"\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\0": "\0", "''": "'"}
_LABEL_ESCAPE = re.compile(r"\\[\\nr0]|''")


def column_labels(source_type: str) -> list[str] | None:
    """The labels of an ENUM or SET column type as the server writes it (``enum('a','it''s')``).

    None for any other type. There a quote is doubled and a backslash, a
    newline, a carriage return and a NUL are escaped with a backslash.
    """
    found = re.fullmatch(r"(?:enum|set)\((.*)\)", source_type.strip(), re.IGNORECASE | re.DOTALL)
    if found is None:
        return None
    return [
        _LABEL_ESCAPE.sub(lambda m: _LABEL_ESCAPES[m[0]], label)
        for label in re.findall(r"'((?:[^'\\]|\\.|'')*)'", found[1], re.DOTALL)
    ]


def _logged_labels(column: Any, plan: ColumnPlan, logged: list[str]) -> list[str]:
    """The labels a logged ENUM index or SET bit names, as the server writes them.

    The log carries them in the column's charset and the library decodes
    them as UTF-8, one it cannot as '': a latin1 ``café`` was '' and a ucs2
    ``b`` was ``\\x00b``, silently, in every row. A label the library did
    decode is its bytes again, decoded in the column's charset. One it could
    not is the table's label at that place (its column type, which the
    server writes as text) where the table's labels agree with every label
    the log did keep; otherwise it is :class:`Unreadable`, and a change
    naming it is refused, naming the column, rather than landing wrong.
    """
    encoding = column_encoding(column)
    if encoding is None or codecs.lookup(encoding).name in ("utf-8", "ascii"):
        return logged
    labels: list[str | None] = []
    for label in logged:
        try:
            labels.append(label.encode("utf-8").decode(encoding) if label else None)
        except UnicodeDecodeError:
            labels.append(None)
    table = column_labels(plan.source_type) or []
    agree = len(table) >= len(labels) and all(
        label is None or label == table[i] for i, label in enumerate(labels)
    )
    unreadable = Unreadable.of(
        SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}, charset "
            f"{getattr(column, 'character_set_name', None)}): a label this change was logged "
            "with cannot be read in that charset, and the column's labels changed since",
            hint="take a new snapshot of the table (combined cdc teardown, then combined cdc "
            "setup)",
            column=plan.name,
        )
    )
    return [
        label if label is not None else table[i] if agree else unreadable
        for i, label in enumerate(labels)
    ]


def _labels(column: Any, plan: ColumnPlan) -> Reader | None:
    size = int(column.size)
    if column.type == _ENUM:
        if not column.enum_values:
            return None
        # (the library's list starts with '', the value of index 0)
        labels = ["", *_column_labels(column, plan)]

        def read_enum(buf: bytes, pos: int) -> tuple[Any, int]:
            return labels[int.from_bytes(buf[pos : pos + size], "little")], pos + size

        def read_checked(buf: bytes, pos: int) -> tuple[Any, int]:
            label, end = read_enum(buf, pos)
            refuse_unreadable(label)
            return label, end

        return read_checked if any(type(v) is Unreadable for v in labels) else read_enum
    if not column.set_values:
        return None
    bits = list(enumerate(_column_labels(column, plan)))

    unreadable = sum(1 << i for i, v in bits if type(v) is Unreadable)

    def read_set(buf: bytes, pos: int) -> tuple[Any, int]:
        mask = int.from_bytes(buf[pos : pos + size], "little")
        if mask & unreadable:
            refuse_unreadable(frozenset(v for i, v in bits if mask >> i & 1))
        return ",".join(v for i, v in bits if mask >> i & 1), pos + size

    return read_set


def _json(column: Any, plan: ColumnPlan) -> Reader:
    """MySQL's binary JSON, parsed by the library's own parser (MariaDB logs JSON as text)."""
    from pymysqlreplication.json_binary import parse_json

    raw = _length_prefixed(int(column.length_size))

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        data, end = raw(buf, pos)
        if not data:
            return None, end
        return server_text(parse_json(data[0], data[1:]), plan, column), end

    return read


def _bits(column: Any, plan: ColumnPlan) -> Reader:
    size = int(column.bytes)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        value = int.from_bytes(buf[pos : pos + size], "big")
        return (bool(value) if plan.kind == "bool" else value), pos + size

    return read


def _strings(column: Any, plan: ColumnPlan) -> Reader | None:
    t = column.type
    if t in (_VARCHAR, _STRING):
        size = 2 if int(column.max_length) > 255 else 1
    else:
        size = int(column.length_size)
    if plan is _PAST:
        return _length_prefixed(size)
    if plan.kind == "string" and t != _GEOMETRY:
        return _text(size, column, plan)
    if plan.kind == "binary" and t != _GEOMETRY and column_encoding(column) is None:
        return _binary(_length_prefixed(size), plan)
    return None


def column_reader(column: Any, plan: ColumnPlan | None) -> Reader | None:
    """The reader of one column of the table map, or ``None`` (the library decodes).

    A column the dataset leaves out (``plan`` None) is read past.
    """
    t = column.type
    if plan is not None and not _fits(column, plan):
        return None
    if plan is None:
        if t == _JSON:
            return _length_prefixed(int(column.length_size))
        if t in (_ENUM, _SET):
            size = int(column.size)
            return lambda buf, pos: (None, pos + size)
        plan = _PAST if t in _STRINGS else _PLANS.get(_KINDS.get(t, ""), _PAST)
        if plan is _PAST and t not in _STRINGS:
            return None
    if t in _STRINGS:
        return _strings(column, plan)
    kind = plan.kind
    if t in _INTS and kind == "int":
        fmt, size = _INTS[t]
        return _fixed(fmt.upper() if column.unsigned else fmt, size)
    make = _READERS.get((t, kind))
    return make(column, plan) if make is not None else None


def _fits(column: Any, plan: ColumnPlan) -> bool:
    """Whether a number in the log has the plan's type (not so after some ALTER TABLEs).

    A value converts as is only then; otherwise the library's value is cast
    from its text, as before.
    """
    t, target = column.type, plan.arrow_type
    if plan.kind == "int" and (t in _INTS or t in (_INT24, _YEAR)):
        signed, unsigned = _INT_TYPES[t]
        return bool(target == (unsigned if column.unsigned and t != _YEAR else signed))
    if plan.kind == "float" and t in (_FLOAT, _DOUBLE):
        return bool(target == (pa.float32() if t == _FLOAT else pa.float64()))
    if (
        plan.kind == "decimal"
        and t == _NEWDECIMAL
        and isinstance(target, pa.Decimal128Type | pa.Decimal256Type)
    ):
        return (target.precision, target.scale) == (int(column.precision), int(column.decimals))
    return plan.kind not in ("int", "float", "decimal")


_INT_TYPES = {
    _TINY: (pa.int8(), pa.uint8()),
    _SHORT: (pa.int16(), pa.uint16()),
    _INT24: (pa.int32(), pa.uint32()),
    _LONG: (pa.int32(), pa.uint32()),
    _LONGLONG: (pa.int64(), pa.uint64()),
    _YEAR: (pa.int16(), pa.int16()),
}
_STRINGS = {_VARCHAR, _STRING, _BLOB, _GEOMETRY}
_KINDS = {
    **{t: "int" for t in (*_INTS, _INT24, _YEAR)},
    _FLOAT: "float",
    _DOUBLE: "float",
    _NEWDECIMAL: "decimal",
    _BIT: "bits",
    _DATE: "date",
    _DATETIME2: "datetime",
    _TIMESTAMP2: "ts",
    _TIME2: "time",
    _JSON: "string",
}
_READERS: dict[tuple[int, str | None], Callable[[Any, ColumnPlan], Reader | None]] = {
    (_INT24, "int"): lambda c, p: _int24(not c.unsigned),
    (_YEAR, "int"): lambda c, p: _year,
    (_FLOAT, "float"): lambda c, p: _fixed("f", 4),
    (_DOUBLE, "float"): lambda c, p: _fixed("d", 8),
    (_NEWDECIMAL, "decimal"): lambda c, p: _decimal(int(c.precision), int(c.decimals)),
    (_BIT, "bool"): _bits,
    (_BIT, "bits"): _bits,
    (_DATE, "date"): lambda c, p: _date,
    (_DATETIME2, "datetime"): lambda c, p: _datetime2(int(c.fsp)),
    (_TIMESTAMP2, "ts"): lambda c, p: _timestamp2(int(c.fsp)),
    (_TIME2, "time"): lambda c, p: _time2(int(c.fsp)),
    (_ENUM, "string"): _labels,
    (_SET, "string"): _labels,
    (_JSON, "string"): _json,
}
#: A column read past: its bytes, undecoded.
_PAST = ColumnPlan("", "", "binary", pa.binary(), "")
_PLANS = {k: ColumnPlan("", "", k, pa.null(), "") for k in set(_KINDS.values())}  # type: ignore[arg-type]


class RowDecoder:
    """Decode one table shape's row images into lists, and their columns into Arrow arrays."""

    def __init__(
        self, names: Sequence[str], readers: Sequence[Reader], plans: Sequence[ColumnPlan | None]
    ) -> None:
        self.names = tuple(names)
        self._readers = tuple(readers)
        self._null_bytes = (len(readers) + 7) // 8
        self._flagged = tuple((1 << i, r) for i, r in enumerate(readers))
        #: The kept columns: (index in the row, plan), in the log's order.
        self.kept = tuple((i, p) for i, p in enumerate(plans) if p is not None)

    def images(self, body: bytes) -> list[list[Any]]:
        """Every row image of an event's body, in order (an update's: before, after, ...).

        An image is its NULL bitmap (every column present: the image is
        FULL), then the values of the columns not NULL.
        """
        out: list[list[Any]] = []
        keep = out.append
        pos, end, size = 0, len(body), self._null_bytes
        readers, flagged, from_bytes = self._readers, self._flagged, int.from_bytes
        while pos < end:
            nulls = from_bytes(body[pos : pos + size], "little")
            pos += size
            row: list[Any] = []
            put = row.append
            if nulls:
                for bit, read in flagged:
                    if nulls & bit:
                        put(None)
                    else:
                        value, pos = read(body, pos)
                        put(value)
            else:
                for read in readers:
                    value, pos = read(body, pos)
                    put(value)
            keep(row)
        return out

    def changes(
        self, body: bytes, op: str, key: Sequence[str]
    ) -> tuple[list[str], list[list[Any]]]:
        """The changes of an event's body: their ops and rows, in log order.

        An update's images come in pairs; one that changes the key is the old
        key's delete followed by the new key's insert (a row the new key did
        not hold: the duplicate check counts it, as it counts any insert).
        """
        images = self.images(body)
        if op != "update":
            return [op] * len(images), images
        where = [self.names.index(k) for k in key if k in self.names]
        ops: list[str] = []
        rows: list[list[Any]] = []
        for before, after in zip(images[::2], images[1::2], strict=True):
            moved = any(before[i] != after[i] for i in where)
            if moved:
                ops.append("delete")
                rows.append(before)
            ops.append("insert" if moved else "update")
            rows.append(after)
        return ops, rows

    def arrays(
        self, rows: Sequence[Sequence[Any]], dataset: str, zero_dates: ZeroDates
    ) -> list[pa.Array]:
        """The kept columns of ``rows`` as Arrow arrays of their plans' types."""
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(self.names)
        return [_array(list(columns[i]), p, dataset, zero_dates) for i, p in self.kept]


def _array(values: list[Any], plan: ColumnPlan, dataset: str, zero_dates: ZeroDates) -> pa.Array:
    kind, target = plan.kind, plan.arrow_type
    assert target is not None
    if kind == "decimal":
        return _decimals(values, target)
    if kind in ("date", "datetime"):
        return convert_column(values, plan, dataset, zero_dates)
    if kind == "time":
        return convert_column(pa.array(values, pa.string()), plan, dataset, zero_dates)
    if kind == "ts" and any(v is _ZERO for v in values):
        if zero_dates != "null":
            raise SchemaMismatch(
                f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} holds a "
                "zero date in the binlog, which is not a date",
                hint="set zero_dates: null to read zero dates as nulls",
                dataset=dataset,
                column=plan.name,
            )
        values = [None if v is _ZERO else v for v in values]
    return pa.array(values, target)


def _decimals(values: list[Any], target: pa.DataType) -> pa.Array:
    """Unscaled integers as a decimal array: their two's complement, little-endian, as is."""
    width = target.byte_width
    zero = bytes(width)
    data = b"".join(zero if v is None else v.to_bytes(width, "little", signed=True) for v in values)
    valid = pa.array([v is not None for v in values]).buffers()[1] if None in values else None
    return pa.Array.from_buffers(target, len(values), [valid, pa.py_buffer(data)])


def row_decoder(columns: Sequence[Any], plans: Mapping[str, ColumnPlan]) -> RowDecoder | None:
    """The decoder of a table map's ``columns``, or ``None`` when the library must decode."""
    names, readers, kept = [], [], []
    for column in columns:
        name = str(column.name)
        plan = plans.get(name)
        reader = column_reader(column, plan)
        if reader is None:
            return None
        names.append(name)
        readers.append(reader)
        kept.append(plan)
    return RowDecoder(names, readers, kept)


def event_body(event: Any) -> bytes | None:
    """The bytes of a rows event after its header and column bitmaps (its row images).

    The library has read the header from its packet and decodes rows from
    there lazily; ``None`` when that packet is not in the expected state, or
    for a partial JSON update.
    """
    if int(event.event_type) == _PARTIAL_UPDATE_ROWS:
        return None  # MySQL's partial JSON updates: the library reads their diffs
    wrapper = getattr(event, "packet", None)
    raw = getattr(wrapper, "packet", None)
    data, start = getattr(raw, "_data", None), getattr(raw, "_position", None)
    if not isinstance(data, bytes) or not isinstance(start, int):
        return None
    if getattr(wrapper, "_BinLogPacketWrapper__data_buffer", b""):
        return None  # bytes pushed back into the wrapper: not where the body starts
    size = int(event.event_size) - int(wrapper.read_bytes)  # type: ignore[union-attr]
    if size < 0 or start + size > len(data):
        return None
    return data[start : start + size]
