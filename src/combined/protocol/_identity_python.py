"""The canonical encoding in pure Python: the reference of ``docs/identity.md`` (never hot)."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import math
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from combined.protocol._identity_sql import (
    _checked_payload,
    _field_type,
    _source_columns,
)
from combined.protocol._identity_types import (
    _EPOCH_NAIVE,
    _EPOCH_ORDINAL,
    _EPOCH_UTC,
    _INFINITE_COUNT,
    _NAN_BITS,
    _NS_PER_UNIT,
    _NULL,
    _TAGS,
    _ZERO_BITS,
    IDENTITY_ENCODING,
    _kind,
    _struct_fields,
    _tlv_py,
)


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


def content_id_python(payload_hash: str, occurrence: int) -> str:
    """The ``_combined_id`` of a keyless table's row (reference only).

    ``payload_hash`` is the row's payload hash as 32 hex digits; ``occurrence``
    its number among the rows of that hash, from 1.
    """
    return _md5(f"{IDENTITY_ENCODING}r{payload_hash.lower()}:{occurrence}")
