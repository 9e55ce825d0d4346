"""Parquet timestamps finer than the lake keeps: refused, never cut without a word.

The lake stores timestamps in microseconds (Delta's unit). DuckDB reads a
Parquet nanosecond column as such, and the lake's cast then cut every value
to the microsecond (``-1 ns`` landed as ``1970-01-01 00:00:00``, a later
instant). A nanosecond column holding a value with a sub-microsecond part,
unless declared, fails the read naming it: declaring ``TIMESTAMP`` or
``TIMESTAMPTZ`` accepts the cut, ``VARCHAR`` keeps the text. A column of
whole microseconds (pandas writes nanoseconds by default) is read as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import duckdb

from combined.connectors.files._settings import FileSet
from combined.errors import SchemaMismatch

#: DuckDB's nanosecond timestamp types (as DESCRIBE names them).
_NANOS = ("TIMESTAMP_NS", "TIMESTAMPTZ_NS", "TIMESTAMP_NS WITH TIME ZONE")


def refuse_finer_than_microseconds(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    types: Sequence[tuple[str, str]],
    source: str,
    quote: Callable[[str], str],
) -> None:
    """Refuse a nanosecond column (of ``types``, the Parquet files' own) holding a value
    finer than a microsecond, read from the table expression ``source``.

    One scan of those columns only, paid where a file set has one. Declared
    columns are cast as declared and not checked; ``quote`` makes an identifier.
    """
    declared = file_set.types
    columns = [n for n, t in types if t in _NANOS and n not in declared]
    if not columns:
        return
    checks = " UNION ALL ".join(
        f"(SELECT {i} FROM {source} WHERE epoch_ns({quote(n)}) % 1000 <> 0 LIMIT 1)"
        for i, n in enumerate(columns)
    )
    found = con.execute(checks).fetchall()
    if not found:
        return
    column = columns[min(int(r[0]) for r in found)]
    raise SchemaMismatch(
        f"column {column!r} of file set {file_set.name!r} holds timestamps finer than a "
        "microsecond, the lake's unit: they would be cut, so nothing was read",
        hint=f"declare the column's type under `columns:` ({column}: TIMESTAMP or "
        "TIMESTAMPTZ keeps the microseconds and cuts the rest, VARCHAR keeps the text); "
        "nothing was committed",
        relation=file_set.name,
        column=column,
    )


__all__ = ["refuse_finer_than_microseconds"]
