"""What the listing commands print: tables for people, ``--format json`` or ``csv`` for scripts.

Tables never shorten an id or a name: a narrow terminal folds a value onto
the next line rather than cut it with an ellipsis; when the output is not a
terminal (a pipe, a log file), a table is printed at its natural width,
each row on one line, however wide. ``json`` is one document on one line,
``csv`` one header row then one row per record, with no Python reprs: no
value is ``None``, ``True`` or a ``datetime(...)``.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.table import Table

from combined.api._json import jsonable
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


def cell(value: Any) -> str:
    """One CSV field: empty for null, lists and objects as JSON, the rest as :func:`jsonable`."""
    value = jsonable(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    return str(value)


def emit_json(value: Any) -> None:
    """``value`` as one line of strict JSON (no NaN) on stdout."""
    sys.stdout.write(json.dumps(jsonable(value), ensure_ascii=False, allow_nan=False) + "\n")


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
