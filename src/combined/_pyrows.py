"""An Arrow table's rows as Python values, whatever the year of its dates.

The lake keeps the dates a source holds: PostgreSQL's run from 4713 BC to
the year 5874897, Python's ``date`` and ``datetime`` from the year 1 to
9999 only (and a timestamp in a column's time zone must land there too). A
column Python cannot hold is handed over with its dates and instants as
text in Arrow's ISO form (``10000-01-01``, ``-0001-01-01 00:00:00.000000Z``),
inside lists, structs and maps alike, instead of failing the whole result;
every other column keeps its Python types. Past the years -9999 and 9999,
where Arrow's text gives up (``<value out of range: 2145042905>`` for
5874897-12-31) or goes wrong, the text is written here in the same form
(an instant in UTC); DuckDB's ``infinity`` and ``-infinity``
(the counts +-(2**31 - 1) of a date, +-(2**63 - 1) of a timestamp) read
as those words, as DuckDB itself writes them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: What pyarrow raises for a value Python's types cannot hold.
_UNHELD = (OverflowError, ValueError)


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, a column Python cannot hold with its dates as text."""
    try:
        rows: list[dict[str, Any]] = table.to_pylist()
    except _UNHELD:
        rows = python_ready(table).to_pylist()
    return rows


def python_ready(table: pa.Table) -> pa.Table:
    """``table`` with each column Python cannot hold cast to its dates as text."""
    for i, field in enumerate(table.schema):
        column = table.column(i)
        try:
            column.to_pylist()
        except _UNHELD:
            chunks = [_texts(chunk) for chunk in column.chunks]
            table = table.set_column(i, field.name, pa.chunked_array(chunks, as_text(field.type)))
    return table


def _texts(arr: pa.Array) -> pa.Array:
    """``arr`` with every date and timestamp in it (nested too) as its text."""
    t = arr.type
    if as_text(t) == t:
        return arr
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return _temporal_texts(arr)
    if pa.types.is_map(t):
        entries = arr.values.flatten()  # (keys, items), whatever the entries' offset
        keys, items = _texts(entries[0]), _texts(entries[1])
        return pa.MapArray.from_arrays(arr.offsets, keys, items, mask=arr.is_null())
    if pa.types.is_struct(t):
        fields = [_texts(child) for child in arr.flatten()]
        names = [f.name for f in t]
        return pa.StructArray.from_arrays(fields, names, mask=arr.is_null())
    # every kind of list: as_text makes it a list
    arr = pc.cast(arr, pa.list_(t.value_type))
    return pa.ListArray.from_arrays(arr.offsets, _texts(arr.values), mask=arr.is_null())


# Arrow's text is right from the year -9999 to 9999 (days since 1970) only:
# past them it writes "<value out of range: N>", or a wrong instant for a
# timestamp (32103-01-10 04:00:54.775807Z for the count 2**63 - 1 in us).
_ARROW_DAYS = (-4_371_587, 2_932_897)


def _temporal_texts(arr: pa.Array) -> pa.Array:
    t = arr.type
    counts = arr.view(pa.int32() if pa.types.is_date32(t) else pa.int64())
    per_day = 1 if pa.types.is_date32(t) else 86_400_000
    if pa.types.is_timestamp(t):
        per_day = 86_400 * 10 ** _DIGITS[t.unit]
    # The bounds as counts, clamped: nanoseconds never leave Arrow's years.
    lo, hi = (pa.scalar(max(-(2**63), min(2**63 - 1, d * per_day))) for d in _ARROW_DAYS)
    beyond = pc.fill_null(pc.or_(pc.less(counts, lo), pc.greater_equal(counts, hi)), False)
    if not pc.any(beyond).as_py():
        return pc.cast(arr, pa.string())
    near = pc.cast(pc.if_else(beyond, pa.scalar(None, t), arr), pa.string())
    written = [
        _far_text(count, t) if far else None
        for count, far in zip(counts.to_pylist(), beyond.to_pylist(), strict=True)
    ]
    return pc.if_else(beyond, pa.array(written, pa.string()), near)


_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _far_text(count: int, t: pa.DataType) -> str:
    """A date's or timestamp's ISO text (a timestamp in UTC) where Arrow writes none."""
    if abs(count) == (2**31 - 1 if pa.types.is_date32(t) else 2**63 - 1):
        return "-infinity" if count < 0 else "infinity"
    if pa.types.is_date(t):
        return _civil(count // 86_400_000 if pa.types.is_date64(t) else count)
    digits = _DIGITS[t.unit]
    seconds, part = divmod(count, 10**digits)
    days, second = divmod(seconds, 86_400)
    clock = f"{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    fraction = f".{part:0{digits}d}" if digits else ""
    return f"{_civil(days)} {clock}{fraction}{'Z' if t.tz else ''}"


def _civil(days: int) -> str:
    """``YYYY-MM-DD`` of a day count since 1970-01-01 (proleptic Gregorian;
    the year astronomical, as Arrow writes it: 0 is 1 BC, -1 is 2 BC)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    sign = "-" if year < 0 else ""
    return f"{sign}{abs(year):04d}-{month:02d}-{day:02d}"


def as_text(t: pa.DataType) -> pa.DataType:
    """``t`` with every date and timestamp in it (nested too) as a string."""
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(as_text(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(as_text(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(as_text(t.key_type), as_text(t.item_type))
    return t
