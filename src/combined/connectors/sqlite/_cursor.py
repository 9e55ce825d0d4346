"""Keyset cursor bounds: the lookback window and the next checkpoint.

A cursor read selects rows with ``lower < cursor <= upper``, where ``upper``
is ``max(cursor)`` read in the same transaction as the rows, and ``lower`` is
the last committed cursor value minus the lookback (strictly greater: with no
lookback an integer cursor resumes right after the last value it saw). The
lookback re-reads the window ``(last - lookback, last]`` so that rows which
became visible late are not missed; the dataset's key makes that overlap
harmless. Numeric cursors take a numeric lookback, subtracted without
rounding the bound up (``lower_by``); ISO-8601 text cursors take
a :class:`datetime.timedelta`.

A NULL cursor is in no window. The cursor's ``nulls`` policy decides:
``fail`` (the default) refuses a read whose transaction sees one, ``include``
reads them in every read, after the window in the same transaction,
``exclude`` leaves them out. A column the catalog proves NOT NULL (a
``NOT NULL`` constraint, a rowid alias) is not checked.

SQLite does not enforce declared types, and it sorts every number before
any text: a cursor column holding both (epoch integers next to ISO text, a
stray ``'n/a'`` in an ``INTEGER`` column), or a checkpoint of another class
than the column, is refused with :class:`~combined.errors.SchemaMismatch`
rather than read with a checkpoint no later number would pass. So is an
infinite real at the top of the column, for the same reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from combined.connectors._shared import lower_by
from combined.connectors.abc import CursorSpec
from combined.errors import ConfigError, SchemaMismatch

_FRACTION = re.compile(r"[T ]\d{2}:\d{2}:\d{2}\.(\d+)")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def lower_bound(last: Any, lookback: Any, column: str) -> Any:
    """The exclusive lower bound of a read that resumes after ``last``."""
    if lookback is None or (_is_number(lookback) and lookback == 0):
        return last
    if isinstance(lookback, timedelta):
        if lookback < timedelta(0):
            raise ConfigError(
                f"the lookback of cursor {column!r} is negative",
                hint="state the lookback as a positive window",
                column=column,
            )
        if lookback == timedelta(0):
            return last
        if isinstance(last, str):
            return shift_iso_text(last, lookback, column)
        raise ConfigError(
            f"cursor {column!r} holds numbers, so its lookback cannot be a timedelta",
            hint="state the lookback as a number in the cursor's own unit",
            column=column,
        )
    if _is_number(lookback):
        if lookback < 0:
            raise ConfigError(
                f"the lookback of cursor {column!r} is negative",
                hint="state the lookback as a positive window",
                column=column,
            )
        if _is_number(last):
            return lower_by(last, lookback)
        raise ConfigError(
            f"cursor {column!r} holds text, so its lookback must be a timedelta",
            hint="state the lookback as a duration, e.g. timedelta(minutes=5)",
            column=column,
        )
    raise ConfigError(
        f"the lookback of cursor {column!r} must be a number or a timedelta",
        hint="use a number for numeric cursors and a timedelta for iso-8601 text cursors",
        column=column,
        lookback=repr(lookback),
    )


def shift_iso_text(text: str, delta: timedelta, column: str) -> str:
    """``text`` minus ``delta``, written in the same ISO-8601 shape as ``text``.

    SQLite compares text cursors byte by byte, so the bound must keep the
    stored shape: separator, fractional digits, ``Z`` or offset. Any rounding
    truncates, which only widens the window (a safe direction).
    """
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"cursor {column!r} holds {text!r}, which is not iso-8601 text, "
            "so a timedelta lookback cannot apply",
            hint="use a numeric cursor, or no lookback",
            column=column,
        ) from None
    shifted = parsed - delta
    if len(text) == 10:  # a bare date
        return shifted.date().isoformat()
    sep = "T" if "T" in text else " "
    fraction = _FRACTION.search(text)
    if fraction is None:
        timespec = "seconds"
    elif len(fraction.group(1)) <= 3:
        timespec = "milliseconds"
    else:
        timespec = "microseconds"
    out = shifted.isoformat(sep=sep, timespec=timespec)
    if text.endswith("Z") and out.endswith("+00:00"):
        out = out[: -len("+00:00")] + "Z"
    return out


def storage_class(value: Any) -> str:
    """The class SQLite orders ``value`` in: ``numbers`` before ``text`` before ``blobs``."""
    if isinstance(value, bytes):
        return "blobs"
    return "text" if isinstance(value, str) else "numbers"


def check_one_order(column: str, low: Any, upper: Any, last: Any) -> None:
    """Refuse a cursor whose values, or checkpoint, fall in more than one storage class.

    SQLite sorts every number before any text and any text before any blob:
    with both in the column, ``max`` is the text and a number written later
    is never above the checkpoint, so it would never be read. ``low`` and
    ``upper`` are the column's ``min`` and ``max``, ``last`` the checkpoint.
    """
    low_class, high_class = storage_class(low), storage_class(upper)
    if low_class != high_class:
        raise SchemaMismatch(
            f"cursor column {column!r} holds both {low_class} and {high_class}: sqlite sorts "
            f"all {low_class} before any {high_class}, so new {low_class} would never be read",
            hint="have the rows fixed at the source so that the column holds one kind of value, "
            "or capture a view that casts the cursor to one type",
            column=column,
        )
    if isinstance(upper, float) and math.isinf(upper):
        raise SchemaMismatch(
            f"cursor column {column!r} holds infinity: as a checkpoint no later value is above "
            "it, so no row written after it would ever be read",
            hint="have the row fixed at the source (NULL, or a finite value), or capture a "
            "view that leaves it out of the cursor",
            column=column,
        )
    if last is not None and storage_class(last) != high_class:
        raise SchemaMismatch(
            f"the checkpoint {last!r} of cursor {column!r} is {storage_class(last)} but the "
            f"column holds {high_class}: no row compares above it",
            hint="reset the dataset's cursor state to read the relation again",
            column=column,
        )


def check_next_rowid(column: str, next_id: int, lower: Any, last: Any) -> None:
    """Refuse a rowid cursor whose next rows sqlite would number at or below the window.

    SQLite numbers a new row ``max(rowid) + 1`` (past ``sqlite_sequence``
    with AUTOINCREMENT). Once that is at or below the read's lower bound (the
    table was dropped and created again, or its newest rows were deleted), no
    window ever reaches the rows written next: every one would be missed
    without a word until the ids pass the checkpoint.
    """
    if _is_number(lower) and next_id <= lower:
        raise SchemaMismatch(
            f"cursor column {column!r} is the table's rowid, and sqlite numbers its next row "
            f"{next_id}, at or below the checkpoint {last!r}: the table was created again or "
            "its newest rows were deleted, and the rows written since would never be read",
            hint="to read the table from its start, capture it as a new dataset (another "
            "dataset name with this relation; the rows read so far stay in this one), or use "
            "strategy: snapshot; to keep ids growing, declare the id AUTOINCREMENT at the source",
            column=column,
            checkpoint=str(last),
            next_id=next_id,
        )


def next_state(
    previous: Mapping[str, Any] | None,
    upper: Any,
    rows: int,
    spec: CursorSpec,
) -> tuple[dict[str, Any], str | None]:
    """The checkpoint after a read of ``rows`` rows bounded above by ``upper``.

    No rows keeps the previous checkpoint unchanged. Otherwise the checkpoint
    is ``upper``, which the read already kept from moving backwards (rows at
    the top may have been deleted since the last read): sqlite compared them
    under the column's collation, which Python's ``>`` on text would not.
    """
    last = (previous or {}).get("cursor")
    if rows == 0 or upper is None:
        state = dict(previous or {})
        return state, None if last is None else str(last)
    return {"cursor": upper, "trust": spec.trust}, str(upper)
