"""What the listing commands print: tables for people, ``--format json`` or ``csv`` for scripts.

Tables never shorten an id or a name: a narrow terminal folds a value onto
the next line rather than cut it with an ellipsis; when the output is not a
terminal (a pipe, a log file), a table is printed at its natural width,
each row on one line, however wide. ``json`` is one document on one line,
``csv`` one header row then one row per record, with no Python reprs: no
value is ``None``, ``True`` or a ``datetime(...)``.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.table import Table

from combined.cli import _fail, console

FORMATS = ("table", "json", "csv")

FormatOpt = Annotated[
    str, typer.Option("--format", help="table, json or csv (json and csv for scripts)")
]
"""``--format`` of a command whose output is a list of records."""

JsonFormatOpt = Annotated[str, typer.Option("--format", help="table or json (for scripts)")]
"""``--format`` of a command whose output is one document, not a list of rows."""


def check_format(fmt: str, allowed: Sequence[str] = FORMATS) -> str:
    """``fmt`` if this command prints it; else a clear error, exit 2."""
    from combined.errors import ConfigError

    if fmt not in allowed:
        _fail(ConfigError(f"unknown format {fmt!r}", hint=f"use {', '.join(allowed)}"))
    return fmt


def table(*headers: str, title: str | None = None) -> Table:
    """A table that cuts no value: a narrow terminal folds an id onto the next line."""
    t = Table(title=title, title_justify="left")
    for header in headers:
        t.add_column(header, overflow="fold")
    return t


def print_table(t: Table) -> None:
    """Print ``t``: at its natural width when the output is not a terminal."""
    if console.is_terminal:
        console.print(t)
    else:
        from rich.console import Console
        from rich.measure import Measurement

        natural = Measurement.get(console, console.options.update_width(10**6), t).maximum
        wide = Console(
            file=console.file, width=max(console.width, natural), markup=False, emoji=False
        )
        wide.print(t)


def plain(value: Any) -> Any:
    """``value`` in JSON's types, for a query's values and the catalog's alike.

    Non-finite floats are the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"`` (JSON has no such numbers, and null would read as SQL
    NULL); bytes are base64; decimals are text (a JSON number would round
    them in most readers); instants, dates and times ISO 8601; durations a
    number of seconds; lists and structs arrays and objects, a map an array
    of ``[key, value]`` pairs (its keys need not be text).
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "_mapping"):  # a catalog row
        return plain(dict(value._mapping))
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return str(value)


def cell(value: Any) -> str:
    """One CSV field: empty for null, lists and objects as JSON, the rest as :func:`plain`."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    return str(value)


def emit_json(value: Any) -> None:
    """``value`` as one line of strict JSON (no NaN) on stdout."""
    sys.stdout.write(json.dumps(plain(value), ensure_ascii=False, allow_nan=False) + "\n")


def emit_csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A header row, then ``rows``, as CSV on stdout."""
    w = csv.writer(sys.stdout, lineterminator="\n")  # as every other line printed
    w.writerow(header)
    for row in rows:
        w.writerow([cell(v) for v in row])


def emit_records(fmt: str, records: Sequence[Mapping[str, Any]], *, header: Sequence[str]) -> bool:
    """Print ``records`` as json or csv and return True; False for ``table``.

    CSV has the columns ``header`` names (a list value is one JSON field).
    """
    if fmt == "json":
        emit_json(list(records))
        return True
    if fmt == "csv":
        emit_csv(header, ([r.get(k) for k in header] for r in records))
        return True
    return False
