"""An Arrow table's rows as Python values, whatever the year of its dates.

The lake keeps the dates a source holds: PostgreSQL's run from 4713 BC to
the year 5874897, Python's ``date`` and ``datetime`` from the year 1 to
9999 only. A column holding a date or an instant beyond that range is
handed over as text in Arrow's ISO form (``10000-01-01``,
``-0001-01-01 00:00:00.000000Z``) instead of failing the whole result;
every other column keeps its Python type.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: The first and last day Python's ``date`` holds, in days since 1970-01-01.
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896
_SECONDS_A_DAY = 86_400
#: Units of a second, by timestamp unit (a nanosecond one always fits).
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, its columns of dates beyond Python's range as text."""
    rows: list[dict[str, Any]] = python_ready(table).to_pylist()
    return rows


def python_ready(table: pa.Table) -> pa.Table:
    """``table`` with each column of dates beyond Python's range (or lists of them) as text."""
    for i, field in enumerate(table.schema):
        column = table.column(i)
        if _beyond(column, field.type):
            table = table.set_column(i, field.name, pc.cast(column, _as_text(field.type)))
    return table


def _as_text(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_as_text(t.value_type))
    return pa.string()


def _beyond(values: Any, t: pa.DataType) -> bool:
    """Whether ``values`` (of type ``t``) hold a date Python cannot."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        flat = pc.list_flatten(values)
        return _beyond(flat, t.value_type) if len(flat) else False
    if pa.types.is_date32(t):
        bounds = (_FIRST_DAY, _LAST_DAY + 1)
        found = pc.min_max(pc.cast(values, pa.int32()))
    elif pa.types.is_date64(t):
        day = _SECONDS_A_DAY * 1_000
        bounds = (_FIRST_DAY * day, (_LAST_DAY + 1) * day)
        found = pc.min_max(pc.cast(values, pa.int64()))
    elif pa.types.is_timestamp(t) and t.unit in _PER_SECOND:
        day = _SECONDS_A_DAY * _PER_SECOND[t.unit]
        bounds = (_FIRST_DAY * day, (_LAST_DAY + 1) * day)
        found = pc.min_max(pc.cast(values, pa.int64()))
    else:
        return False
    low, high = found["min"].as_py(), found["max"].as_py()
    return low is not None and (low < bounds[0] or high >= bounds[1])
