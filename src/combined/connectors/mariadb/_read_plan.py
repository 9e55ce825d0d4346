"""The options and the plan of one MariaDB/MySQL read (:mod:`._extract` reads it).

``ReadOptions`` validates a request's options over the source's settings;
``refuse_cursor_order`` says which columns order a cursor read's pages (the
engine asks it before a Run too); ``Work`` is what a read learned of its
relation in its snapshot, and the helpers build its SQL and its window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from combined.connectors._shared import (
    check_lookback,
    cursor_order,
    lower_by,
    numeric_lookback,
    sql_read_options,
    time_window,
)
from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._connect import Settings, ZeroDates, zero_dates_option
from combined.connectors.mariadb._types import ColumnPlan, Layout
from combined.errors import ConfigError

DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_PAGE_ROWS = 1_000_000


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The options of one read, from ``ReadRequest.options`` over the source's settings.

    ``casts`` ({column: ``text``}), ``zero_dates`` (``error`` or ``null``),
    ``batch_bytes`` (the target size of a batch), ``page_rows`` (rows per
    keyset page of a cursor read) and ``control_totals`` (``True`` for a
    count, or a column name for a count and that column's exact sum, read in
    the same snapshot after the last row).
    """

    casts: Mapping[str, str] = field(default_factory=dict)
    zero_dates: ZeroDates = "error"
    batch_bytes: int = DEFAULT_BATCH_BYTES
    page_rows: int = DEFAULT_PAGE_ROWS
    control_totals: bool | str = False

    @classmethod
    def of(cls, request: ReadRequest, settings: Settings) -> ReadOptions:
        """Validate ``request.options``; the source's casts apply unless the read names its own."""
        opts = request.options
        _, table = catalog.parse_relation(request.relation, settings.database)
        casts = opts.get("casts")
        if casts is None:
            casts = settings.casts.get(request.relation) or settings.casts.get(table) or {}
        shared = sql_read_options(
            request, casts, batch_bytes=DEFAULT_BATCH_BYTES, page_rows=DEFAULT_PAGE_ROWS
        )
        zero = zero_dates_option(opts.get("zero_dates", settings.zero_dates))
        return cls(shared.casts, zero, shared.batch_bytes, shared.page_rows, shared.control_totals)


def refuse_cursor_order(
    dataset: str, by_name: Mapping[str, ColumnPlan], cursor: str, key: Sequence[str]
) -> list[str]:
    """The columns that order a cursor read's pages, cursor first; refused unless they can.

    The engine asks it before a Run too (``MariaDBSource.preflight``):
    ``combined check`` passed a text, time or bit cursor that every capture
    then refused, a Run ``failed`` as if a retry could help.
    """
    plan = by_name[cursor]
    if not plan.orderable:
        raise ConfigError(
            f"dataset {dataset!r}: column {cursor!r} ({plan.source_type}) cannot serve as a cursor",
            hint="choose a number, date, datetime or timestamp column; see discovery",
            dataset=dataset,
            column=cursor,
        )
    order = cursor_order(cursor, key)
    for c in order:
        if not by_name[c].keyable:
            raise ConfigError(
                f"dataset {dataset!r}: key column {c!r} ({by_name[c].source_type}) "
                "cannot order pages",
                hint="declare a key of numbers, text, dates, timestamps or bytes",
                dataset=dataset,
                column=c,
            )
    return order


@dataclass(slots=True)
class Work:
    relation: catalog.Relation
    layout: Layout
    by_name: dict[str, ColumnPlan]
    where: str | None = None
    control_where: str | None = None
    checkpoint: Any = None


def where_clause(parts: list[str | None]) -> str:
    kept = [p for p in parts if p]
    return f" WHERE {' AND '.join(kept)}" if kept else ""


def server_time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def lower_bound(plan: ColumnPlan, last: Any, lookback: Any) -> Any:
    """``last`` minus the lookback: rows above it are read again (the key dedups them)."""
    if lookback is None:
        return last
    check_lookback(plan.name, lookback)
    if plan.temporal:
        window = time_window(lookback)
        if isinstance(last, datetime):
            return last - window
        if isinstance(last, date):  # whole days, rounded up: a wider window is the safe side
            return last - timedelta(days=-(-window // timedelta(days=1)))
    return lower_by(last, numeric_lookback(plan.name, lookback))
