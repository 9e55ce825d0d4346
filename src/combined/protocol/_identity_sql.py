"""The canonical encoding as DuckDB SQL: the hot path (``docs/identity.md``, section 4)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from combined.protocol._digest import HEX, Digest, md5_sql
from combined.protocol._identity_types import (
    _NAN_BITS,
    _NULL,
    _RESERVED_PREFIX,
    _TAGS,
    _ZERO_BITS,
    IDENTITY_ENCODING,
    _kind,
    _struct_fields,
    _tlv_py,
)


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
    if precision is not None and scale < precision <= 18 and scale <= 4:
        # The value at the smallest scale that holds it exactly, printed: a
        # few casts cost less than trimming the text (a digit always precedes
        # the point at these precisions, so no leading zero needs restoring).
        # The comparison widens both sides to (precision + scale, scale).
        # Not past 18 digits: on 128-bit decimals the casts cost 6-10x the
        # trimming below (DECIMAL(20,2), (34,4): 0.5-0.9 us a value).
        whens = [
            f"WHEN CAST({number} AS DECIMAL({precision},{k})) = {number} "
            f"THEN CAST(CAST({number} AS DECIMAL({precision},{k})) AS VARCHAR)"
            for k in range(scale)
        ]
        return f"(CASE {' '.join(whens)} ELSE {text} END)"
    if precision is not None and scale < precision:
        # A digit precedes the point (DuckDB prints '0.50'): trimming is all.
        return _trimmed_sql(_narrowed_text_sql(number, scale, precision))
    trimmed = _trimmed_sql(text)
    return (
        f"(CASE WHEN {trimmed} = '' THEN '0' "
        f"ELSE regexp_replace({trimmed}, '^(-?)\\.', '\\10.') END)"
    )


def _trimmed_sql(text: str) -> str:
    """SQL of a decimal's ``text`` (it holds a point) without trailing fractional zeros or point.

    One anchored regexp: DuckDB's ``rtrim`` with a character set cost ~0.25
    us a value, twice (``rtrim(rtrim(text, '0'), '.')``); this ~0.07.
    """
    return f"regexp_replace({text}, '\\.?0+$', '')"


def narrowed_decimal_sql(number: str, scale: int) -> tuple[str, str] | None:
    """SQL of a wide decimal ``number`` as a 64-bit one: (whether it fits, the narrowed value).

    DuckDB prints a decimal of more than 18 digits (a 128-bit integer) ~15
    times slower than one of up to 18 (a 64-bit one), and hashes it as its
    two halves xor-ed: a value that fits 18 digits at the same ``scale`` is
    the same value as a DECIMAL(18, ``scale``). None for a scale 18 digits
    do not hold.
    """
    if not 0 <= scale <= 18:
        return None
    return f"abs({number}) < {10 ** (18 - scale)}", f"CAST({number} AS DECIMAL(18,{scale}))"


def _narrowed_text_sql(number: str, scale: int, precision: int) -> str:
    """SQL of the text of a DECIMAL(``precision``, ``scale``) ``number``, printed cheaply:
    a value that fits 18 digits is printed as a 64-bit decimal (the same text, exactly)."""
    text = f"CAST({number} AS VARCHAR)"
    narrowed = None if precision <= 18 or scale >= 18 else narrowed_decimal_sql(number, scale)
    if narrowed is None:
        return text
    fits, narrow = narrowed
    return f"(CASE WHEN {fits} THEN CAST({narrow} AS VARCHAR) ELSE {text} END)"


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
    return _tlv_once_sql(_TAGS[kind], _nested_text_sql(v, t, kind, depth, where), depth)


def _nested_text_sql(v: str, t: pa.DataType, kind: str, depth: int, where: str) -> str:
    """SQL for the ``<text>`` of a list, struct or map ``v`` not NULL (no tag, no length)."""
    _refuse_wide_members(t, where)
    if pa.types.is_dictionary(t):
        t = t.value_type
    var = f"__combined_v{depth}"
    if kind == "list":
        item = _cell_sql(var, t.value_type, depth + 1, f"{where}[]")
        return f"array_to_string(list_transform({v}, lambda {var}: {item}), '')"
    if kind == "struct":
        parts = [
            _member_sql(f.name, f"struct_extract({v}, {_literal(f.name)})", f.type, depth, where)
            for f in _struct_fields(t)
        ]
        return _concat(parts)
    if kind == "map":
        key = _cell_sql(f"{var}['key']", t.key_type, depth + 1, f"{where}{{key}}")
        value = _cell_sql(f"{var}['value']", t.item_type, depth + 1, f"{where}{{value}}")
        # Entries are sorted as UTF-8 bytes; BLOB ordering ignores the
        # connection's default collation, VARCHAR ordering would not.
        blob = f"__combined_b{depth}"
        encoded = f"list_transform(map_entries({v}), lambda {var}: encode({key} || {value}))"
        return (
            f"array_to_string(list_transform(list_sort({encoded}), "
            f"lambda {blob}: decode({blob})), '')"
        )
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
    if kind == "list" and depth == 0 and absent == "":
        # A payload's list: its text is null exactly when the list is, so it
        # joins the flat concat as a scalar's does. A CASE over the list (its
        # text computed for the rows that hold one) cost as much again as the
        # text: 300 rows of 25,000 strings took 1.5 s a column, 0.83 s so.
        text = _nested_text_sql(v, t, kind, depth, where)
        return _flat_pieces(v, (_TAGS[kind], text, None), head, absent)
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


def identity_sql(key: Sequence[str], schema: pa.Schema, digest: Digest = HEX) -> str:
    """A DuckDB expression for ``_combined_id``: 32 lowercase hex digits, or 16 bytes (v2)."""
    return md5_sql(identity_text_sql(key, schema), digest)


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


def payload_hash_sql(columns: Sequence[str], schema: pa.Schema, digest: Digest = HEX) -> str:
    """A DuckDB expression for ``_combined_payload_hash``: 32 hex digits, or 16 bytes (v2)."""
    return md5_sql(payload_text_sql(columns, schema), digest)


def content_id_sql(payload_hash: str, occurrence: str, digest: Digest = HEX) -> str:
    """A DuckDB expression for the ``_combined_id`` of a row of a table without a key.

    ``payload_hash`` is the row's payload hash column (in ``digest`` format),
    ``occurrence`` its number (1, 2, ...) among the capture's rows of that
    hash. The text is ``c1r``, the hash's 32 lowercase hex digits, ``:`` and
    the number (docs/identity.md, section 9).
    """
    hex_hash = payload_hash if digest == HEX else f"lower(hex({payload_hash}))"
    text = f"'{IDENTITY_ENCODING}r' || {hex_hash} || ':' || CAST({occurrence} AS VARCHAR)"
    return md5_sql(text, digest)


def payload_columns(schema: pa.Schema) -> list[str]:
    """The source's own columns of ``schema``: those not named ``_combined_*``.

    This is the default payload of :func:`compute_identity`,
    :func:`with_identity` and :func:`payload_hash_python`.
    """
    return _source_columns(schema)


def _source_columns(schema: pa.Schema) -> list[str]:
    return [name for name in schema.names if not name.startswith(_RESERVED_PREFIX)]
