"""The canonical encoding's constants and type families (``docs/identity.md``).

Shared by the SQL encoding (:mod:`._identity_sql`), the Python reference
(:mod:`._identity_python`) and running it in DuckDB (:mod:`.identity`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pyarrow as pa

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


def _tlv_py(tag: str, text: str) -> str:
    """``<tag><n>:<text>``: one value's canonical text with its tag and UTF-8 length."""
    return f"{tag}{len(text.encode('utf-8'))}:{text}"
