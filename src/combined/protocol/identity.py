"""Stable row identity and payload hashing under a versioned canonical encoding.

``_combined_id`` is the md5 of the canonical text of the declared key values;
``_combined_payload_hash`` is the md5 of the canonical text of the row payload.
The canonical text is defined here and in ``docs/identity.md`` (encoding
``c1``); it depends on the values only, never on DuckDB's ``hash()``, on a
locale or on how a library formats floats, so the same key gives the same id
on every machine and library version.

The hot path is SQL: :func:`identity_sql` and :func:`payload_hash_sql` build
DuckDB expressions that compute both columns vectorised. The ``*_python``
functions are a pure-Python reference of the same encoding, for documentation
and cross-checking only.

Each value is encoded as ``<tag><n>:<text>`` where ``<tag>`` is one ASCII
letter naming the value's family, ``<n>`` the decimal byte length of the UTF-8
``<text>``; a null is ``n0:``. The length prefix makes any concatenation of
encoded values parse back in exactly one way.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import math
import os
import struct
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "ID_COLUMN",
    "IDENTITY_ENCODING",
    "PAYLOAD_HASH_COLUMN",
    "canonical_sql",
    "compute_identity",
    "duckdb_compatible",
    "duckdb_scannable_schema",
    "identity_python",
    "identity_sql",
    "identity_text_python",
    "identity_text_sql",
    "payload_columns",
    "payload_hash_python",
    "payload_hash_sql",
    "payload_text_python",
    "payload_text_sql",
    "quote_ident",
    "with_identity",
]

#: Version of the canonical encoding; it prefixes every canonical text, so a
#: future encoding can never produce the same ids by accident.
IDENTITY_ENCODING = "c1"

ID_COLUMN = "_combined_id"
PAYLOAD_HASH_COLUMN = "_combined_payload_hash"

# Columns with this prefix are engine provenance or control columns, never
# source payload.
_RESERVED_PREFIX = "_combined_"

_NULL = "n0:"
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Canonical float texts for values with several bit patterns (NaN payloads,
# signed zero): one text each, so values that compare equal encode equally.
_NAN_BITS = "7ff8000000000000"
_ZERO_BITS = "0000000000000000"
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
# The stored timestamp counts PostgreSQL and DuckDB read as +/-infinity.
_INFINITE_COUNT = 2**63 - 1


# --------------------------------------------------------------------------
# Type classification (shared by the SQL and the Python encodings)
# --------------------------------------------------------------------------


_t = pa.types
# Family of each plain Arrow type, by predicate; the first match wins.
_FAMILIES: tuple[tuple[Callable[[pa.DataType], bool], str], ...] = (
    (_t.is_null, "null"),
    (_t.is_boolean, "bool"),
    (_t.is_integer, "int"),
    (_t.is_floating, "float"),
    (lambda t: _t.is_string(t) or _t.is_large_string(t) or _t.is_string_view(t), "string"),
    (lambda t: _t.is_binary(t) or _t.is_large_binary(t) or _t.is_binary_view(t), "binary"),
    (_t.is_fixed_size_binary, "binary"),
    (_t.is_date, "date"),
    (lambda t: _t.is_timestamp(t) and t.tz is None, "timestamp"),
    (_t.is_timestamp, "timestamptz"),
    (_t.is_time, "time"),
    (_t.is_map, "map"),  # before lists: a map is also a list in Arrow
    (lambda t: _t.is_list(t) or _t.is_large_list(t) or _t.is_fixed_size_list(t), "list"),
    (lambda t: _t.is_list_view(t) or _t.is_large_list_view(t), "list"),
    # DuckDB holds decimals of precision up to 38, with a scale in 0..precision.
    (lambda t: _t.is_decimal(t) and 0 <= t.scale <= t.precision <= 38, "decimal"),
    # Wider decimals (decimal256 up to 76 digits) reach DuckDB as their plain
    # text (see duckdb_compatible), canonicalised there as text: top level only.
    (lambda t: _t.is_decimal(t) and 0 <= t.scale <= t.precision, "bigdecimal"),
    (lambda t: _t.is_struct(t) and len(set(t.names)) == t.num_fields, "struct"),
)
_EXTENSIONS = {"arrow.uuid": "uuid", "arrow.json": "json"}


def _kind(t: pa.DataType, where: str) -> str:
    """Name the encoding family of ``t``, or raise TypeError naming ``where``."""
    if _t.is_dictionary(t):
        return _kind(t.value_type, where)
    if isinstance(t, pa.BaseExtensionType):
        kind = _EXTENSIONS.get(t.extension_name)
    else:
        kind = next((k for test, k in _FAMILIES if test(t)), None)
    if kind is None:
        raise TypeError(
            f"column {where!r} has type {t}, which has no canonical identity encoding "
            f"({IDENTITY_ENCODING}); cast it to a supported type or leave it out of the "
            "key and payload"
        )
    return kind


_TAGS = {
    "bool": "b",
    "int": "e",
    "decimal": "e",
    "bigdecimal": "e",
    "float": "f",
    "string": "s",
    "json": "j",
    "binary": "x",
    "uuid": "u",
    "date": "d",
    "timestamp": "t",
    "timestamptz": "z",
    "time": "h",
    "list": "l",
    "struct": "r",
    "map": "m",
}


def _struct_fields(t: pa.DataType) -> list[pa.Field]:
    # Sorted by name so that reordering struct fields keeps the encoding.
    return sorted((t.field(i) for i in range(t.num_fields)), key=lambda f: f.name)


# --------------------------------------------------------------------------
# SQL encoding (the hot path)
# --------------------------------------------------------------------------


def quote_ident(name: str) -> str:
    """Quote ``name`` as a DuckDB identifier, doubling embedded quotes."""
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} holds a NUL character, which DuckDB cannot name")
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _tlv_sql(tag: str, text: str) -> str:
    # One n-ary concat costs a third less than a chain of `||`, which copies
    # the growing text at every step.
    return f"concat('{tag}', strlen({text}), ':', {text})"


def _tlv_once_sql(tag: str, text: str, depth: int) -> str:
    # For nested texts: binding `text` to a lambda parameter evaluates it
    # once; naming it twice would double the SQL at every nesting level.
    s = f"__combined_s{depth}"
    return f"list_transform([{text}], lambda {s}: {_tlv_sql(tag, s)})[1]"


def _concat(parts: Sequence[str]) -> str:
    # concat reads a NULL part as '' (where `||` would give NULL), and one
    # n-ary concat is cheaper than a chain of `||`.
    return f"concat({', '.join(parts)})" if parts else "''"


def _decimal_text_sql(number: str, scale: int, precision: int | None = None) -> str:
    """SQL for the canonical text of the DECIMAL expression ``number`` of ``scale``."""
    text = f"CAST({number} AS VARCHAR)"
    if scale == 0:
        return text
    # Drop trailing fractional zeros, then restore a missing leading zero:
    # DuckDB prints DECIMAL(p,p) as '.50', other DECIMALs as '0.50'; both
    # renderings of the digits give one text.
    if precision is not None and scale < precision <= 38 - scale and scale <= 4:
        # The value at the smallest scale that holds it exactly, printed: a
        # few casts cost less than trimming the text (a digit always precedes
        # the point at these precisions, so no leading zero needs restoring).
        # The comparison widens both sides to (precision + scale, scale).
        whens = [
            f"WHEN CAST({number} AS DECIMAL({precision},{k})) = {number} "
            f"THEN CAST(CAST({number} AS DECIMAL({precision},{k})) AS VARCHAR)"
            for k in range(scale)
        ]
        return f"(CASE {' '.join(whens)} ELSE {text} END)"
    trimmed = f"rtrim(rtrim({text}, '0'), '.')"
    return (
        f"(CASE WHEN {trimmed} = '' THEN '0' "
        f"ELSE regexp_replace({trimmed}, '^(-?)\\.', '\\10.') END)"
    )


def _micros_from_ns_sql(ns: str) -> str:
    # Exact decimal arithmetic (ns * 0.001 has scale 6): whole microseconds
    # print as integers, so s/ms/us/ns units agree on an instant.
    return _decimal_text_sql(f"(CAST({ns} AS DECIMAL(22,3)) * 0.001)", 6)


def _scalar_tlv(v: str, t: pa.DataType, kind: str) -> tuple[str, str, str | None] | None:
    """``(tag, text, length)`` of a scalar ``v`` that is not NULL; None for nested kinds.

    ``text`` is NULL exactly when ``v`` is (every branch propagates NULL),
    which lets :func:`_flat_pieces` spread the value over a flat concat.
    ``length`` is None when it is ``strlen(text)``.
    """
    if pa.types.is_dictionary(t):
        t = t.value_type
    tag = _TAGS[kind]
    if kind in ("bool", "int", "string", "json"):
        return tag, f"CAST({v} AS VARCHAR)", None
    if kind == "bigdecimal":
        # Its plain text (never an exponent), with the type's scale: the
        # fraction's trailing zeros and a bare point go, as for any decimal.
        text = f"CAST({v} AS VARCHAR)"
        trimmed = f"rtrim(rtrim({text}, '0'), '.')"
        return tag, f"(CASE WHEN contains({text}, '.') THEN {trimmed} ELSE {text} END)", None
    if kind == "decimal":
        # The cast pins the scale to the Arrow type's, so the text does not
        # depend on how the relation happens to hold the column.
        number = f"CAST({v} AS DECIMAL({t.precision},{t.scale}))"
        return tag, _decimal_text_sql(number, t.scale, t.precision), None
    if kind == "float":
        # The IEEE-754 binary64 bit pattern: exact, and free of any library's
        # float printing; one pattern for NaN and for zero.
        x = f"CAST({v} AS DOUBLE)"
        bits = f"lpad(lower(hex(CAST(CAST({x} AS BIT) AS BIGINT))), 16, '0')"
        text = (
            f"(CASE WHEN isnan({x}) THEN '{_NAN_BITS}' "
            f"WHEN {x} = 0 THEN '{_ZERO_BITS}' ELSE {bits} END)"
        )
        return tag, text, "16"
    if kind == "binary":
        blob = f"CAST({v} AS BLOB)"
        return tag, f"lower(hex({blob}))", f"2 * octet_length({blob})"
    if kind == "uuid":
        return tag, f"CAST({v} AS VARCHAR)", "36"
    if kind == "date":
        return tag, f"CAST(({v} - DATE '1970-01-01') AS VARCHAR)", None
    if kind in ("timestamp", "timestamptz", "time"):
        if t.unit == "ns":
            text = _micros_from_ns_sql(f"epoch_ns({v})")
        else:
            # A TIMESTAMPTZ is never cast (that would read the TimeZone
            # setting); a naive TIMESTAMP_S/_MS is, so that epoch_us binds its
            # microsecond overload rather than overflowing through nanoseconds.
            us = f"CAST({v} AS TIMESTAMP)" if kind == "timestamp" else v
            text = f"CAST(epoch_us({us}) AS VARCHAR)"
        if kind == "time":
            return tag, text, None
        # DuckDB reads the stored counts +/-(2**63 - 1) as +/-infinity, for
        # which epoch_us/epoch_ns give NULL.
        infinity = (
            f"(CASE WHEN {v} IS NULL THEN NULL WHEN starts_with(CAST({v} AS VARCHAR), '-') "
            "THEN '-infinity' ELSE 'infinity' END)"
        )
        return tag, f"coalesce({text}, {infinity})", None
    return None


def _refuse_wide_members(t: pa.DataType, where: str) -> None:
    """Raise TypeError when a member of nested ``t`` is a decimal of more than 38 digits.

    Only a top-level column reaches DuckDB as its plain text (duckdb_compatible).
    """
    if pa.types.is_map(t):
        members = [t.key_type, t.item_type]
    else:
        members = [t.field(i).type for i in range(t.num_fields)]
    if any(pa.types.is_decimal(m) and m.precision > 38 for m in members):
        raise TypeError(
            f"column {where!r} has type {t}: a decimal of more than 38 digits inside a "
            f"list, struct or map has no canonical identity encoding ({IDENTITY_ENCODING}); "
            "cast it to text or leave it out of the key and payload"
        )


def _nested_sql(v: str, t: pa.DataType, kind: str, depth: int, where: str) -> str:
    """SQL for ``<tag><n>:<text>`` of a list, struct or map ``v`` that is not NULL."""
    _refuse_wide_members(t, where)
    if pa.types.is_dictionary(t):
        t = t.value_type
    tag = _TAGS[kind]
    var = f"__combined_v{depth}"
    if kind == "list":
        item = _cell_sql(var, t.value_type, depth + 1, f"{where}[]")
        text = f"array_to_string(list_transform({v}, lambda {var}: {item}), '')"
        return _tlv_once_sql(tag, text, depth)
    if kind == "struct":
        parts = [
            _member_sql(f.name, f"struct_extract({v}, {_literal(f.name)})", f.type, depth, where)
            for f in _struct_fields(t)
        ]
        return _tlv_once_sql(tag, _concat(parts), depth)
    if kind == "map":
        key = _cell_sql(f"{var}['key']", t.key_type, depth + 1, f"{where}{{key}}")
        value = _cell_sql(f"{var}['value']", t.item_type, depth + 1, f"{where}{{value}}")
        # Entries are sorted as UTF-8 bytes; BLOB ordering ignores the
        # connection's default collation, VARCHAR ordering would not.
        blob = f"__combined_b{depth}"
        encoded = f"list_transform(map_entries({v}), lambda {var}: encode({key} || {value}))"
        text = (
            f"array_to_string(list_transform(list_sort({encoded}), "
            f"lambda {blob}: decode({blob})), '')"
        )
        return _tlv_once_sql(tag, text, depth)
    raise AssertionError(kind)  # pragma: no cover - _kind is exhaustive


def _flat_pieces(v: str, scalar: tuple[str, str, str | None], head: str, absent: str) -> list[str]:
    """``head <tag><n>:<text>`` of a scalar ``v`` as pieces of a flat concat, ``absent`` when NULL.

    concat skips NULL pieces, and every piece but the first is NULL exactly
    when ``v`` is: one flat concat then builds a whole row's text without a
    nested concat (and its intermediate string) per value, about a quarter
    less CPU for a typical row than the nested form, with the same text.
    """
    tag, text, length = scalar
    if length is not None and length.isdigit():  # a constant length joins the head
        head, length = f"{head}{tag}{length}:", None
        pieces = []
    else:
        head += tag
        pieces = [f"({length if length is not None else f'strlen({text})'} || ':')"]
    when_null = "NULL" if absent == "" else _literal(absent)
    return [f"(CASE WHEN {v} IS NULL THEN {when_null} ELSE {_literal(head)} END)", *pieces, text]


def _value_pieces(
    v: str, t: pa.DataType, kind: str, depth: int, where: str, head: str, absent: str
) -> list[str]:
    """``head <tag><n>:<text>`` of ``v`` as pieces of a concat; ``absent`` when ``v`` is NULL."""
    scalar = _scalar_tlv(v, t, kind)
    if scalar is not None:
        return _flat_pieces(v, scalar, head, absent)
    value = _nested_sql(v, t, kind, depth, where)
    if head:
        value = f"concat({_literal(head)}, {value})"
    return [f"(CASE WHEN {v} IS NULL THEN {_literal(absent)} ELSE {value} END)"]


def _cell_pieces(v: str, t: pa.DataType, depth: int, where: str) -> list[str]:
    kind = _kind(t, where)
    if kind == "null":
        return [f"'{_NULL}'"]
    return _value_pieces(v, t, kind, depth, where, "", _NULL)


def _cell_sql(v: str, t: pa.DataType, depth: int, where: str) -> str:
    return _concat(_cell_pieces(v, t, depth, where))


def _member_pieces(name: str, v: str, t: pa.DataType, depth: int, where: str) -> list[str]:
    # A named member (payload column, struct field): omitted when null, so a
    # column or field that is absent and one that is null encode the same.
    path = f"{where}.{name}" if where else name
    kind = _kind(t, path)
    if kind == "null":
        return []
    return _value_pieces(v, t, kind, depth, path, _tlv_py("s", name), "")


def _member_sql(name: str, v: str, t: pa.DataType, depth: int, where: str) -> str:
    return _concat(_member_pieces(name, v, t, depth, where))


def canonical_sql(column: str, arrow_type: pa.DataType) -> str:
    """A DuckDB expression for the canonical text of ``column``'s value.

    The expression yields ``n0:`` for a null and ``<tag><n>:<text>`` otherwise
    (see ``docs/identity.md``). ``arrow_type`` is the column's Arrow type; the
    relation must hold the column as DuckDB maps that Arrow type on a scan.
    Raises TypeError naming the column for a type without an encoding.
    """
    return _cell_sql(quote_ident(column), arrow_type, 0, column)


def _field_type(schema: pa.Schema, name: str) -> pa.DataType:
    index = schema.get_field_index(name)
    if index < 0:
        if name in schema.names:
            raise ValueError(f"column {name!r} appears more than once in the schema")
        raise ValueError(f"column {name!r} is not in the schema ({', '.join(schema.names)})")
    return schema.field(index).type


def _checked_key(key: Sequence[str]) -> list[str]:
    if isinstance(key, str):
        raise TypeError(f"the key must be a sequence of column names, not the string {key!r}")
    if not key:
        raise ValueError("the key must name at least one column")
    return list(key)


def _checked_payload(columns: Sequence[str]) -> list[str]:
    if isinstance(columns, str):
        raise TypeError(f"payload columns must be a sequence of names, not the string {columns!r}")
    names = sorted(columns)
    for a, b in zip(names, names[1:], strict=False):
        if a == b:
            raise ValueError(f"payload column {a!r} is listed twice")
    return names


def identity_text_sql(key: Sequence[str], schema: pa.Schema) -> str:
    """A DuckDB expression for the canonical text of the key ``key``.

    The text is the encoding version followed by each key value's canonical
    text in key order.
    """
    parts = [
        piece
        for name in _checked_key(key)
        for piece in _cell_pieces(quote_ident(name), _field_type(schema, name), 0, name)
    ]
    return _concat([f"'{IDENTITY_ENCODING}'", *parts])


def identity_sql(key: Sequence[str], schema: pa.Schema) -> str:
    """A DuckDB expression for ``_combined_id``: 32 lowercase hex digits."""
    return f"md5({identity_text_sql(key, schema)})"


def payload_text_sql(columns: Sequence[str], schema: pa.Schema) -> str:
    """A DuckDB expression for the canonical text of the payload ``columns``.

    The text is the encoding version followed, for each column in UTF-8 byte
    order of its name whose value is not null, by the name encoded as a
    string and the value's canonical text.
    """
    parts = [
        piece
        for name in _checked_payload(columns)
        for piece in _member_pieces(name, quote_ident(name), _field_type(schema, name), 0, "")
    ]
    return _concat([f"'{IDENTITY_ENCODING}'", *parts])


def payload_hash_sql(columns: Sequence[str], schema: pa.Schema) -> str:
    """A DuckDB expression for ``_combined_payload_hash``: 32 lowercase hex digits."""
    return f"md5({payload_text_sql(columns, schema)})"


def payload_columns(schema: pa.Schema) -> list[str]:
    """The source's own columns of ``schema``: those not named ``_combined_*``.

    This is the default payload of :func:`compute_identity`,
    :func:`with_identity` and :func:`payload_hash_python`.
    """
    return _source_columns(schema)


def _source_columns(schema: pa.Schema) -> list[str]:
    return [name for name in schema.names if not name.startswith(_RESERVED_PREFIX)]


# --------------------------------------------------------------------------
# Python reference encoding
# --------------------------------------------------------------------------


def _tlv_py(tag: str, text: str) -> str:
    return f"{tag}{len(text.encode('utf-8'))}:{text}"


def _micros_from_ns_py(ns: int) -> str:
    if ns % 1000 == 0:
        return str(ns // 1000)
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(ns), 1000)
    return f"{sign}{whole}.{frac:03d}".rstrip("0")


def _decimal_text(value: object) -> str:
    if not isinstance(value, decimal.Decimal | int) or isinstance(value, bool):
        raise TypeError(f"expected a Decimal or int, got {type(value).__name__}")
    d = decimal.Decimal(value)
    if not d.is_finite():
        raise ValueError(f"decimal {d} is not finite")
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _float_text(value: object, t: pa.DataType) -> str:
    x = float(value)  # type: ignore[arg-type]
    # Round to the column's width first: DuckDB holds the stored value.
    if pa.types.is_float32(t):
        x = struct.unpack("<f", struct.pack("<f", x))[0]
    elif pa.types.is_float16(t):
        x = struct.unpack("<e", struct.pack("<e", x))[0]
    if math.isnan(x):
        return _NAN_BITS
    if x == 0:
        return _ZERO_BITS
    return struct.pack(">d", x).hex()


def _timestamp_text(value: object, t: pa.DataType) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) == _INFINITE_COUNT:
            return "-infinity" if value < 0 else "infinity"
        return _micros_from_ns_py(value * _NS_PER_UNIT[t.unit])
    if not isinstance(value, dt.datetime):
        raise TypeError(f"expected a datetime or int, got {type(value).__name__}")
    if (value.tzinfo is None) != (t.tz is None):
        raise ValueError(f"datetime {value!r} does not match {t} (time zone awareness differs)")
    delta = value - (_EPOCH_NAIVE if t.tz is None else _EPOCH_UTC)
    return str(delta // dt.timedelta(microseconds=1))


def _time_ns(value: object, t: pa.DataType) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value * _NS_PER_UNIT[t.unit]
    if not isinstance(value, dt.time):
        raise TypeError(f"expected a time or int, got {type(value).__name__}")
    seconds = value.hour * 3600 + value.minute * 60 + value.second
    return (seconds * 1_000_000 + value.microsecond) * 1000


def _date_days(value: object, t: pa.DataType) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value // 86_400_000 if pa.types.is_date64(t) else value
    if not isinstance(value, dt.date):
        raise TypeError(f"expected a date or int, got {type(value).__name__}")
    return value.toordinal() - _EPOCH_ORDINAL


def _uuid_text(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return str(uuid.UUID(bytes=value))
    return str(uuid.UUID(str(value)))


def _from_scalar(value: pa.Scalar, kind: str) -> object:
    if not value.is_valid:
        return None
    if kind in ("date", "timestamp", "timestamptz", "time"):
        # The raw stored count: as_py() cannot hold nanoseconds.
        return value.value
    if kind == "list":
        return list(value.values)
    if kind == "struct":
        return {name: value[name] for name in value.keys()}
    if kind == "map":
        entries = value.values
        return list(zip(entries.field("key"), entries.field("value"), strict=True))
    return value.as_py()


def _text_py(value: object, t: pa.DataType, kind: str, where: str) -> str:
    if pa.types.is_dictionary(t):
        t = t.value_type
    simple: dict[str, Callable[[], str]] = {
        "bool": lambda: "true" if value else "false",
        "int": lambda: str(int(value)),  # type: ignore[call-overload]
        "decimal": lambda: _decimal_text(value),
        "bigdecimal": lambda: _decimal_text(value),
        "float": lambda: _float_text(value, t),
        "binary": lambda: bytes(value).hex(),  # type: ignore[call-overload]
        "uuid": lambda: _uuid_text(value),
        "date": lambda: str(_date_days(value, t)),
        "timestamp": lambda: _timestamp_text(value, t),
        "timestamptz": lambda: _timestamp_text(value, t),
        "time": lambda: _micros_from_ns_py(_time_ns(value, t)),
    }
    if kind in simple:
        return simple[kind]()
    if kind in ("string", "json"):
        if not isinstance(value, str):
            raise TypeError(f"expected a str for {where!r}, got {type(value).__name__}")
        return value
    if kind == "list":
        items: Any = value
        return "".join(_cell_py(item, t.value_type, f"{where}[]") for item in items)
    if kind == "struct":
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping for {where!r}, got {type(value).__name__}")
        return "".join(
            _member_py(f.name, value.get(f.name), f.type, where) for f in _struct_fields(t)
        )
    if kind == "map":
        pairs: Any = value.items() if isinstance(value, Mapping) else value
        entries = [
            _cell_py(k, t.key_type, f"{where}{{key}}")
            + _cell_py(v, t.item_type, f"{where}{{value}}")
            for k, v in pairs
        ]
        return "".join(sorted(entries, key=lambda e: e.encode("utf-8")))
    raise AssertionError(kind)  # pragma: no cover - _kind is exhaustive


def _cell_py(value: object, t: pa.DataType, where: str) -> str:
    kind = _kind(t, where)
    while isinstance(value, pa.DictionaryScalar):
        value = value.value if value.is_valid else None
    if isinstance(value, pa.Scalar):
        value = _from_scalar(value, kind)
    if value is None:
        return _NULL
    if kind == "null":
        raise ValueError(f"column {where!r} has the null type but holds {value!r}")
    return _tlv_py(_TAGS[kind], _text_py(value, t, kind, where))


def _member_py(name: str, value: object, t: pa.DataType, where: str) -> str:
    path = f"{where}.{name}" if where else name
    encoded = _cell_py(value, t, path)
    return "" if encoded == _NULL else _tlv_py("s", name) + encoded


def identity_text_python(values: Sequence[object], types: Sequence[pa.DataType]) -> str:
    """The canonical text of a key, computed in Python (reference only).

    ``values`` are Python values as ``pyarrow`` returns them (``as_py()``) or
    ``pyarrow`` scalars; a temporal value may also be the raw integer count
    in its Arrow type's unit (this is how nanoseconds are given exactly).
    """
    if len(values) != len(types):
        raise ValueError(f"{len(values)} key values for {len(types)} key types")
    if not values:
        raise ValueError("the key must hold at least one value")
    parts = [
        _cell_py(v, t, f"key[{i}]") for i, (v, t) in enumerate(zip(values, types, strict=True))
    ]
    return IDENTITY_ENCODING + "".join(parts)


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def identity_python(values: Sequence[object], types: Sequence[pa.DataType]) -> str:
    """``_combined_id`` of one key, computed in Python (reference only)."""
    return _md5(identity_text_python(values, types))


def payload_text_python(
    row: Mapping[str, object], schema: pa.Schema, columns: Sequence[str] | None = None
) -> str:
    """The canonical payload text of ``row``, computed in Python (reference only).

    ``columns`` defaults to :func:`payload_columns` of ``schema``; a column
    missing from ``row`` counts as null.
    """
    names = _checked_payload(_source_columns(schema) if columns is None else columns)
    parts = [_member_py(n, row.get(n), _field_type(schema, n), "") for n in names]
    return IDENTITY_ENCODING + "".join(parts)


def payload_hash_python(
    row: Mapping[str, object], schema: pa.Schema, columns: Sequence[str] | None = None
) -> str:
    """``_combined_payload_hash`` of one row, computed in Python (reference only)."""
    return _md5(payload_text_python(row, schema, columns))


# --------------------------------------------------------------------------
# Running it in DuckDB
# --------------------------------------------------------------------------

_QUERY_STARTS = ("select", "with", "from", "values", "table", "(")

# DuckDB type names (as DESCRIBE shows them) accepted for each family; a
# relation column of another family would silently encode differently.
_DUCKDB_FAMILIES: dict[str, tuple[str, ...]] = {
    "bool": ("BOOLEAN",),
    "int": ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT")
    + ("UINTEGER", "UBIGINT", "UHUGEINT"),
    "float": ("FLOAT", "DOUBLE"),
    "string": ("VARCHAR",),
    "json": ("VARCHAR", "JSON"),
    "binary": ("BLOB",),
    "uuid": ("UUID",),
    "date": ("DATE",),
    "timestamp": ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"),
    "timestamptz": ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ_NS"),
    "time": ("TIME", "TIME_NS"),
}


def _duckdb_type_fits(kind: str, duckdb_type: str) -> bool:
    if kind == "null":
        return True
    if kind == "decimal":
        return duckdb_type.startswith("DECIMAL(") or duckdb_type in _DUCKDB_FAMILIES["int"]
    if kind == "bigdecimal":
        return duckdb_type == "VARCHAR"  # its plain text (see duckdb_compatible)
    if kind == "list":
        return duckdb_type.endswith("]")
    if kind == "struct":
        return duckdb_type.startswith("STRUCT(")
    if kind == "map":
        return duckdb_type.startswith("MAP(")
    return duckdb_type in _DUCKDB_FAMILIES[kind]


def _as_relation(relation_sql: str) -> str:
    text = relation_sql.strip()
    if text.lower().startswith(_QUERY_STARTS) and not text.startswith("("):
        return f"({text})"
    return text


def with_identity(
    con: duckdb.DuckDBPyConnection,
    relation_sql: str,
    key: Sequence[str],
    schema: pa.Schema,
    payload_columns: Sequence[str] | None = None,
) -> str:
    """A SELECT of ``relation_sql`` with ``_combined_id`` and ``_combined_payload_hash`` added.

    ``relation_sql`` is a table or view name (quoted as needed) or a query.
    ``payload_columns`` defaults to the source columns of ``schema``. ``con``
    is used to check, without reading rows, that every key and payload
    column exists with a DuckDB type of its Arrow type's family; existing
    ``_combined_id``/``_combined_payload_hash`` columns are replaced.
    """
    relation = _as_relation(relation_sql)
    names = _source_columns(schema) if payload_columns is None else list(payload_columns)
    id_expr = identity_sql(key, schema)
    hash_expr = payload_hash_sql(names, schema)
    described = con.sql(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    actual = {str(row[0]): str(row[1]) for row in described}
    for name in dict.fromkeys([*key, *names]):
        if name not in actual:
            raise ValueError(f"column {name!r} is not in the relation {relation_sql!r}")
        arrow_type = _field_type(schema, name)
        if not _duckdb_type_fits(_kind(arrow_type, name), actual[name]):
            raise TypeError(
                f"column {name!r} is {actual[name]} in the relation but {arrow_type} in the schema"
            )
    replaced = [quote_ident(n) for n in (ID_COLUMN, PAYLOAD_HASH_COLUMN) if n in actual]
    star = f"* EXCLUDE ({', '.join(replaced)})" if replaced else "*"
    return (
        f"SELECT {star}, {id_expr} AS {quote_ident(ID_COLUMN)}, "
        f"{hash_expr} AS {quote_ident(PAYLOAD_HASH_COLUMN)} FROM {relation}"
    )


def _scannable_type(t: pa.DataType, top: bool = True) -> pa.DataType:
    """The type to cast ``t`` to before DuckDB scans it (values unchanged).

    A decimal of more than 38 digits (DuckDB holds no wider one) becomes its
    plain text at the top level (:func:`decimal_plain_text`); nested, it stays.
    """
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_decimal(t) and t.precision > 38:
        return pa.string() if top else t
    if pa.types.is_decimal(t) and not pa.types.is_decimal128(t):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.json":
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_scannable_type(t.value_type, False)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_scannable_type(t.value_type, False)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_scannable_type(t.value_type, False)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct(
            [
                t.field(i).with_type(_scannable_type(t.field(i).type, False))
                for i in range(t.num_fields)
            ]
        )
    if pa.types.is_map(t):
        return pa.map_(_scannable_type(t.key_type, False), _scannable_type(t.item_type, False))
    return t


def duckdb_scannable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types DuckDB cannot scan replaced by ones it can (see below)."""
    fields = [f.with_type(_scannable_type(f.type)) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def duckdb_compatible(table: pa.Table) -> pa.Table:
    """``table`` with the columns DuckDB cannot scan cast to types it can, values unchanged.

    float16 becomes float32, decimal32/64/256 (precision up to 38) become
    decimal128 and JSON becomes its string storage, also inside lists,
    structs and maps; the canonical encoding of each value stays the same.
    """
    target = duckdb_scannable_schema(table.schema)
    if target == table.schema:
        return table
    columns = [
        decimal_plain_text(column)
        if pa.types.is_decimal(column.type) and pa.types.is_string(field.type)
        else column.cast(field.type)
        for column, field in zip(table.columns, target, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=target)


def decimal_plain_text(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Decimals as plain text with their type's scale (``0.0000001000``), never an exponent.

    Arrow's own cast writes small values with an exponent (``1.000E-7``).
    Python's decimal formatting is exact and plain; it runs a value at a time,
    which only decimals of more than 38 digits, rare and never a hot path, take.
    """
    values = column.to_pylist()
    return pa.array([None if v is None else format(v, "f") for v in values], pa.string())


def compute_identity(
    data: pa.Table | pa.RecordBatch,
    key: Sequence[str],
    payload_columns: Sequence[str] | None = None,
    *,
    con: duckdb.DuckDBPyConnection | None = None,
) -> tuple[pa.Array, pa.Array]:
    """Compute ``_combined_id`` and ``_combined_payload_hash`` for every row of ``data``.

    The work runs vectorised in DuckDB over the Arrow data: on ``con`` when
    given, else on an in-memory connection kept per thread. The two string
    arrays are in input order. ``payload_columns`` defaults to the source
    columns (names not starting with ``_combined_``).
    """
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    names = _source_columns(table.schema) if payload_columns is None else list(payload_columns)
    used = list(dict.fromkeys([*_checked_key(key), *names]))
    schema = pa.schema([table.schema.field(_field_index(table.schema, n)) for n in used])
    # Build the SQL first: an unsupported type fails before any data moves.
    id_expr = identity_sql(key, schema)
    hash_expr = payload_hash_sql(names, schema)

    ordinal = "__combined_identity_ordinal"
    if ordinal in used:
        raise ValueError(f"column name {ordinal!r} is reserved")
    con = con if con is not None else _thread_connection()
    columns = duckdb_compatible(table.select(used)).columns
    order = ""
    # A projection of one table keeps its rows' order when the connection
    # preserves insertion order (DuckDB's default); otherwise the rows are
    # numbered and sorted back, which costs about a tenth of the hashing.
    (preserved,) = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0]
    if preserved:
        scan = pa.Table.from_arrays(columns, names=used)
    else:
        # A vectorised 0..n-1.
        ones = pa.nulls(table.num_rows, pa.int64()).fill_null(1)
        positions = pc.subtract(pc.cumulative_sum(ones), 1)
        scan = pa.Table.from_arrays([*columns, positions], names=[*used, ordinal])
        order = f" ORDER BY {quote_ident(ordinal)}"
    view = f"__combined_identity_{uuid.uuid4().hex}"
    con.register(view, scan)
    try:
        result = con.sql(
            f"SELECT {id_expr} AS id, {hash_expr} AS payload_hash FROM {quote_ident(view)}{order}"
        ).to_arrow_table()
    finally:
        con.unregister(view)
    ids = result.column("id").combine_chunks()
    hashes = result.column("payload_hash").combine_chunks()
    return ids.cast(pa.string()), hashes.cast(pa.string())


_local = threading.local()


def _thread_connection() -> duckdb.DuckDBPyConnection:
    # Opening a DuckDB connection costs tens of milliseconds, more than
    # hashing a typical batch; one empty in-memory database per thread (and
    # per process, as connections do not survive a fork) is reused instead.
    import duckdb

    cached = getattr(_local, "connection", None)
    if cached is None or cached[0] != os.getpid():
        cached = (os.getpid(), duckdb.connect(":memory:"))
        _local.connection = cached
    con: duckdb.DuckDBPyConnection = cached[1]
    return con


def _field_index(schema: pa.Schema, name: str) -> int:
    _field_type(schema, name)  # raises a clear error for missing or duplicate names
    return int(schema.get_field_index(name))
