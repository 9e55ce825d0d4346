"""The text form of PostgreSQL values (pgoutput's ``t`` columns) -> Arrow, a column at a time.

Scalars convert with Arrow casts over the whole column. One-dimensional
arrays split with Arrow compute when no element is quoted (the common
case); a column with a quoted element, bounds or nesting is parsed value by
value. bytea and interval values need a per-value parse.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from combined.errors import SchemaMismatch, UnsupportedType

#: The day counts DuckDB reads as a date's +-infinity (its ``date_t`` limits).
DATE_INFINITY = 2**31 - 1
#: ... and the microseconds it reads as a timestamp's (``timestamp_t``).
TIMESTAMP_INFINITY = 2**63 - 1

__all__ = ["array_type_of", "arrow_type", "text_to_arrow"]

# Built-in type OIDs (pg_type.dat) whose text form has a faithful Arrow reading.
_SIMPLE_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(),  # bool
    17: pa.binary(),  # bytea
    20: pa.int64(),  # int8
    21: pa.int16(),  # int2
    23: pa.int32(),  # int4
    26: pa.int64(),  # oid (unsigned 32-bit)
    700: pa.float32(),  # float4
    701: pa.float64(),  # float8
    1082: pa.date32(),  # date
    1083: pa.time64("us"),  # time
    1114: pa.timestamp("us"),  # timestamp
    1184: pa.timestamp("us", tz="UTC"),  # timestamptz (the session runs in UTC)
    1186: pa.month_day_nano_interval(),  # interval (read from IntervalStyle=iso_8601)
}
# Kept as their PostgreSQL text: exact, and readable by every lake reader.
# char, name, text, json, xml, cidr, macaddr8, macaddr, inet, bpchar, varchar,
# timetz, bit, varbit, uuid, pg_lsn, jsonb, jsonpath.
_TEXT_TYPES = frozenset(
    {18, 19, 25, 114, 142, 650, 774, 829, 869, 1042, 1043, 1266, 1560, 1562, 2950, 3220, 3802, 4072}
)
# One-dimensional arrays of the types above: array type OID -> element type OID.
_ARRAYS = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1007: 23, 1009: 25, 1014: 1042,
    1015: 1043, 1016: 20, 1021: 700, 1022: 701, 1028: 26, 1040: 829, 1041: 869, 1115: 1114,
    1182: 1082, 1183: 1083, 1185: 1184, 1187: 1186, 1231: 1700, 199: 114, 2951: 2950,
    3807: 3802, 651: 650, 143: 142, 775: 774, 1270: 1266, 1561: 1560, 1563: 1562, 3221: 3220,
    4073: 4072,
}  # fmt: skip
_NUMERIC = 1700


def array_type_of(element_oid: int) -> int | None:
    """The built-in one-dimensional array type OID whose elements are ``element_oid``."""
    return next((a for a, e in _ARRAYS.items() if e == element_oid), None)


def arrow_type(type_oid: int, type_modifier: int = -1, *, column: str = "?") -> pa.DataType:
    """The Arrow type of a column of PostgreSQL type ``type_oid``.

    ``numeric(p, s)`` becomes ``decimal128(p, s)`` (``decimal256`` above 38
    digits); an unconstrained ``numeric``, or one of more than 76 digits
    (beyond ``decimal256``), stays text, as the snapshot reads it.
    A one-dimensional array becomes a list of its element's type. Types
    without a faithful mapping (``money``, ranges, geometric types,
    unresolved user types) raise ``UnsupportedType`` naming the column.
    """
    if type_oid in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[type_oid]
    if type_oid in _TEXT_TYPES:
        return pa.string()
    if type_oid in _ARRAYS:
        element = arrow_type(_ARRAYS[type_oid], type_modifier, column=column)
        # As the snapshot reads them (_types._array_plan): over 38 digits, as text.
        return pa.list_(pa.string() if pa.types.is_decimal256(element) else element)
    if type_oid == _NUMERIC:
        # The snapshot's own mapping: the stream must type a column as it does.
        from combined.connectors.postgres._types import decimal_type, numeric_typmod

        typmod = numeric_typmod(type_modifier)
        decimal = decimal_type(*typmod) if typmod else None
        return pa.string() if decimal is None else decimal
    raise UnsupportedType(
        f"column {column!r} has postgresql type oid {type_oid} without an arrow mapping",
        hint="exclude the column from the publication, or cast it in a view captured by snapshot",
        column=column,
        type_oid=type_oid,
    )


class _Unlistable(ValueError):
    """An array literal no list holds: several dimensions, or subscripts from neither 0 nor 1."""


def text_to_arrow(
    values: Sequence[bytes | None] | pa.Array, type_: pa.DataType, column: str
) -> pa.Array:
    """One column's wire text values (bytes, or a binary array) as an Arrow array of ``type_``.

    Scalars convert with Arrow casts over the whole column; bytea and
    interval values, and arrays with quoted elements, need a per-value parse.
    """
    wire = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    try:
        if pa.types.is_list(type_):
            return _arrays(wire, type_, column)
        if pa.types.is_binary(type_):
            # bytea text is '\x' + hex (bytea_output=hex); Arrow has no hex kernel.
            hexed = [None if v is None else bytes.fromhex(v[2:].decode()) for v in wire.to_pylist()]
            return pa.array(hexed, pa.binary())
        if pa.types.is_interval(type_):
            return pa.array([None if v is None else _interval(v) for v in wire.to_pylist()], type_)
        text = wire.cast(pa.string())
        if pa.types.is_string(type_):
            return text
        if pa.types.is_boolean(type_):
            return pc.equal(text, "t")
        if pa.types.is_time(type_):
            stamped = pc.binary_join_element_wise("1970-01-01 ", text, "")
            return stamped.cast(pa.timestamp("us")).cast(pa.int64()).cast(type_)
        if pa.types.is_timestamp(type_) or pa.types.is_date(type_):
            return _datetimes(text, type_)
        return text.cast(type_)
    except _Unlistable as exc:
        # It read "holds a value that is not a valid list<...>", with a hint about
        # infinite dates and NaN numerics; a snapshot names the array's shape.
        raise SchemaMismatch(
            f"column {column!r} holds {exc}: a list keeps the elements, not their "
            "dimensions or subscripts",
            hint=f"leave {column!r} out of the dataset's `columns:`, or capture the "
            "relation with the snapshot or cursor strategy and a cast to text",
            column=column,
        ) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OverflowError) as exc:
        # OverflowError: a timestamp past Arrow's range (year 294276), converted in Python.
        raise _unheld(wire, type_, column, str(exc)) from None


#: numeric's texts of NaN and its infinities.
_NOT_FINITE = r"^(NaN|-?Infinity)$"


def _unheld(wire: pa.Array, type_: pa.DataType, column: str, detail: str) -> SchemaMismatch:
    """The refusal of a value no ``type_`` holds; a decimal's NaN or infinity named as such.

    It said "a value that is not a valid decimal128(10, 2)", where the
    snapshot of the same value says "NaN or infinity", and its hint blamed
    infinite dates, which land since (``_datetimes``).
    """
    told = f"a value that is not a valid {type_}"
    if pa.types.is_decimal(type_):
        texts = wire.cast(pa.string())
        if pc.any(pc.match_substring_regex(texts, _NOT_FINITE)).as_py():
            told = f"NaN or infinity, which {type_} cannot hold"
    return SchemaMismatch(
        f"column {column!r} holds {told}",
        hint=f"leave {column!r} out of the dataset's `columns:`, or capture the relation "
        "with the snapshot or cursor strategy and a cast to text; or clean the values",
        column=column,
        detail=detail[:200],
    )


_DATETIME = re.compile(
    r"^(\d+)-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?$"
)


def _datetimes(text: pa.Array, type_: pa.DataType) -> pa.Array:
    """Dates and timestamps as Arrow casts them, and those it cannot parse in Python.

    Arrow's cast takes neither a year before 1 (``0044-03-15 BC``) nor one
    past 9999, which PostgreSQL writes so and the snapshot reads (binary):
    the stream stopped on a value the snapshot of the same table had landed.
    ``infinity`` and ``-infinity`` are the counts +-(2**31 - 1) (a date's days)
    or +-(2**63 - 1) (a timestamp's microseconds), as the snapshot reads them
    and DuckDB reads them back.
    """
    far = pc.fill_null(pc.match_substring_regex(text, r" BC$|^\d{5}|^-?infinity$"), False)
    if not pc.any(far).as_py():
        return text.cast(type_)
    near = pc.if_else(far, pa.scalar(None, pa.string()), text).cast(type_)
    values = [
        _far_datetime(v, type_) if f else None
        for v, f in zip(text.to_pylist(), far.to_pylist(), strict=True)
    ]
    date = pa.types.is_date(type_)
    ints = pa.array(values, pa.int32() if date else pa.int64())
    far_values = ints.cast(pa.date32() if date else pa.timestamp("us", tz=type_.tz))
    return pc.if_else(far, far_values.cast(type_), near)


def _far_datetime(text: str, type_: pa.DataType) -> int:
    """Days (a date) or microseconds (a timestamp) since 1970 of PostgreSQL's ISO text."""
    if text in ("infinity", "-infinity"):
        infinity = DATE_INFINITY if pa.types.is_date(type_) else TIMESTAMP_INFINITY
        return -infinity if text[0] == "-" else infinity
    m = _DATETIME.match(text)
    if m is None:
        raise ValueError(f"not an iso date or timestamp: {text[:40]!r}")
    year, month, day, hour, minute, sec, frac, sign, oh, om, os_, bc = m.groups()
    days = _days_from_civil(1 - int(year) if bc else int(year), int(month), int(day))
    if pa.types.is_date(type_):
        return days
    offset = int(oh or 0) * 3600 + int(om or 0) * 60 + int(os_ or 0)
    seconds = days * 86400 + int(hour or 0) * 3600 + int(minute or 0) * 60 + int(sec or 0)
    seconds -= -offset if sign == "-" else offset
    return seconds * 1_000_000 + int((frac or "").ljust(6, "0"))


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 0 is 1 BC)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


_INTERVAL = re.compile(
    rb"^P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
    rb"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?)(\d+)(?:\.(\d{1,6}))?S)?)?$"
)


def _interval(text: bytes) -> tuple[int, int, int]:
    """(months, days, nanoseconds) of an ISO 8601 interval as PostgreSQL writes it."""
    m = _INTERVAL.match(text)
    if m is None or text == b"P":
        raise ValueError(f"not an iso 8601 interval: {text[:40]!r}")
    years, months, days, hours, minutes, sign, secs, frac = m.groups()
    micros = int(secs or 0) * 1_000_000 + int((frac or b"").ljust(6, b"0"))
    micros = -micros if sign else micros
    micros += (int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1_000_000
    return int(years or 0) * 12 + int(months or 0), int(days or 0), micros * 1000


def _arrays(values: pa.Array, type_: pa.ListType, column: str) -> pa.Array:
    """One-dimensional array literals as a list array (elements converted as a column)."""
    plain = _plain_arrays(values)
    if plain is not None:
        offsets, flat = plain
    else:
        offset_list, items = [0], list[bytes | None]()
        for v in values.to_pylist():
            if v is not None:
                items += _array_items(v)
            offset_list.append(len(items))
        offsets, flat = pa.array(offset_list, pa.int32()), pa.array(items, pa.binary())
    converted = text_to_arrow(flat, type_.value_type, column)
    return pa.ListArray.from_arrays(offsets, converted, type=type_, mask=values.is_null())


# A quoted array element whose text needs no unescaping: no quote, backslash,
# comma or brace inside (a pair never spans a separator, which is a comma).
_SIMPLY_QUOTED = r'"([^"\\,{}]*)"'


def _plain_arrays(values: pa.Array) -> tuple[pa.Array, pa.Array] | None:
    """(offsets, elements) of array literals without bounds, nesting or escapes; else None.

    PostgreSQL quotes an element holding a comma, a brace, a quote, a
    backslash, white space or the text NULL, and writes an empty array as
    ``{}``: without a quote, the elements are the text between the commas,
    and ``NULL`` is a null element. A quoted element without a comma, brace
    or backslash (a timestamp's or a phrase's space) is its text unquoted;
    the quoted text ``"NULL"`` and every other quoted element go the slow way
    (a ``timestamptz[]`` column streamed 4x slower per row than four
    ``timestamptz`` columns, each of its values parsed in Python).
    """
    text = values.cast(pa.string())
    shaped = pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}"))
    quoted = pc.utf8_slice_codeunits(text, 1, -1)
    inner = pc.replace_substring_regex(quoted, _SIMPLY_QUOTED, r"\1")
    odd = pc.or_(pc.match_substring(inner, '"'), pc.match_substring_regex(inner, "[{}]"))
    odd = pc.or_(odd, pc.match_substring(quoted, '"NULL"'))
    if pc.all(pc.and_(shaped, pc.invert(odd))).as_py() is False:
        return None
    parts = pc.split_pattern(inner, ",")
    empty = np.asarray(pc.fill_null(pc.equal(quoted, ""), True), dtype=bool)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(parts), 0), dtype=np.int64)
    lengths[empty] = 0
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    items = parts.flatten()
    parents = np.asarray(pc.list_parent_indices(parts), dtype=np.int64)
    items = items.filter(pa.array(~empty[parents])) if empty.any() else items
    elements = pc.if_else(pc.equal(items, "NULL"), pa.scalar(None, pa.string()), items)
    return pa.array(offsets), elements.cast(pa.binary())


def _array_items(text: bytes) -> list[bytes | None]:
    """The elements of ``{a,"b c",NULL}``; bounds (``[0:1]=``) are dropped where
    the snapshot's read drops them too (a lower bound of 0 or 1), else refused."""
    if text.startswith(b"["):
        bounds, _, text = text.partition(b"=")
        if any(int(b.split(b":")[0]) not in (0, 1) for b in bounds[1:-1].split(b"][")):
            raise _Unlistable(
                f"an array whose subscripts {bounds.decode()} start at neither 0 nor 1"
            )
    if not (text.startswith(b"{") and text.endswith(b"}")):
        raise ValueError(f"not an array literal: {text[:40]!r}")
    body, out, i = text[1:-1], list[bytes | None](), 0
    if not body:
        return out
    while True:
        if body[i : i + 1] == b"{":
            raise _Unlistable("a multi-dimensional array")
        if body[i : i + 1] == b'"':
            item, i = bytearray(), i + 1
            while body[i : i + 1] != b'"':
                if body[i : i + 1] == b"\\":
                    i += 1
                item += body[i : i + 1]
                i += 1
                if i >= len(body):
                    raise ValueError("unterminated quoted array element")
            out.append(bytes(item))
            i += 1
        else:
            end = body.find(b",", i)
            end = len(body) if end < 0 else end
            raw = body[i:end]
            out.append(None if raw == b"NULL" else raw)
            i = end
        if i >= len(body):
            return out
        if body[i : i + 1] != b",":
            raise ValueError(f"unexpected {body[i : i + 1]!r} in an array literal")
        i += 1
