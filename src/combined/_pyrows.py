"""An Arrow table's rows as Python values, whatever the year of its dates.

The lake keeps the dates a source holds: PostgreSQL's run from 4713 BC to
the year 5874897, Python's ``date`` and ``datetime`` from the year 1 to
9999 only (and a timestamp in a column's time zone must land there too). A
column Python cannot hold is handed over with its dates and instants as
text in Arrow's ISO form (``10000-01-01``, ``-0001-01-01 00:00:00.000000Z``),
inside lists, structs and maps alike, instead of failing the whole result;
every other column keeps its Python types.
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
            table = table.set_column(i, field.name, pc.cast(column, as_text(field.type)))
    return table


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
