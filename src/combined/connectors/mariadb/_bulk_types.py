"""The bulk path's select list and conversion: native values where connectorx reads them exactly.

connectorx reads the binary protocol's values into Arrow itself. Where its
Arrow value is exactly the row path's (:mod:`~combined.connectors.mariadb._types`)
the column is selected as it is and only cast to the read's type; elsewhere
it is selected as the server's text (``CAST(... AS CHAR)``) and converted as
the row path converts it. Text costs the server a formatting per value and
the client a parse per value, and makes the result larger.

==========================  ==========================================  =======================
column                      selected                                    connectorx gives
==========================  ==========================================  =======================
integers, year              as is                                       int8..int64, uint8..uint64
float, double               as is (a FLOAT widened to DOUBLE)           float64
bit                         ``col + 0``                                 uint32 / uint64
time                        microseconds since midnight (SIGNED)        int64
decimal(p,s), s <= 10,      as is                                       decimal128(38,10), exact:
p - s <= 18                                                             rust_decimal rescaled to 10
decimal, other              text                                        (a larger scale is rounded,
                                                                        a larger number refused)
char, varchar, text, enum,  as is                                       utf8 string
set
date, datetime, timestamp   ``IF(MONTH(c) = 0 OR DAYOFMONTH(c) = 0,     date32 / timestamp[us]
(zero_dates null, or NOT    NULL, c)``: a zero date is NULL (with       (the session's +00:00)
NULL)                       ``error``, a NULL of a NOT NULL column
                            is a zero date, refused)
date, datetime, timestamp   text (a NULL and a zero date must be
(nullable, zero_dates       told apart)
error)
json, uuid, inet, casts     text
binary types                as is                                       binary
==========================  ==========================================  =======================

connectorx refuses a zero date (it panics), which is why no temporal column
reaches it without the ``IF``. A column whose Arrow value comes out of
connectorx in another type than the read's is cast, checked: a value that
does not fit raises :class:`~combined.errors.SchemaMismatch`.
"""

from __future__ import annotations

import re

import pyarrow as pa

from combined.connectors.mariadb._connect import ZeroDates, quote_ident
from combined.connectors.mariadb._types import ColumnPlan, convert_column
from combined.errors import SchemaMismatch

#: Column types read as the server's strings (others, such as MySQL's JSON, as text).
_NATIVE_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
#: The largest scale and integer digits connectorx's decimals (rust_decimal) hold exactly.
_DECIMAL_SCALE, _DECIMAL_INTEGER_DIGITS = 10, 18
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)", re.IGNORECASE)


def native(plan: ColumnPlan, zero_dates: ZeroDates) -> bool:
    """Whether connectorx reads ``plan``'s column exactly as the row path reads its text."""
    kind = plan.kind
    if kind in ("int", "float", "bool", "bits", "time", "binary"):
        return True  # numbers (the plan's own expression is numeric) and bytes
    plain = plan.expr == quote_ident(plan.name)  # not a declared cast
    family = plan.source_type.split("(")[0].split()[0].lower() if plan.source_type else ""
    if kind == "decimal":
        digits = _decimal_digits(plan)
        return plain and digits is not None and _fits_connectorx(*digits)
    if kind == "string":
        return plain and family in _NATIVE_STRINGS
    if plan.temporal:
        return plain and (zero_dates == "null" or not plan.nullable)
    return False


def _decimal_digits(plan: ColumnPlan) -> tuple[int, int] | None:
    target = plan.arrow_type
    if isinstance(target, pa.Decimal128Type):
        return target.precision, target.scale
    match = _DECIMAL.match(plan.source_type.replace(" ", ""))
    return (int(match[1]), int(match[2])) if match else None


def _fits_connectorx(precision: int, scale: int) -> bool:
    return scale <= _DECIMAL_SCALE and precision - scale <= _DECIMAL_INTEGER_DIGITS


def expression(plan: ColumnPlan, zero_dates: ZeroDates) -> str:
    """The select expression of ``plan``'s column on the bulk path."""
    if not native(plan, zero_dates):
        return f"CAST({plan.expr} AS CHAR)"
    if plan.temporal:
        q = plan.expr
        return f"IF(MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0, NULL, {q})"
    return plan.expr


def convert(column: pa.Array, plan: ColumnPlan, dataset: str, zero_dates: ZeroDates) -> pa.Array:
    """One column of a connectorx batch as the read's Arrow type (see the module table)."""
    target = plan.arrow_type
    assert target is not None
    if plan.kind == "binary":
        return column if column.type.equals(pa.binary()) else column.cast(pa.binary())
    if not native(plan, zero_dates):
        if not column.type.equals(pa.string()):
            column = column.cast(pa.string())
        return convert_column(column, plan, dataset, zero_dates)
    if plan.temporal and zero_dates != "null" and column.null_count:
        raise SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} holds a zero "
            "date (0000-00-00, or a month or day of 00), which is not a date",
            hint="set zero_dates: null to read zero dates as nulls, or "
            + plan.cast_hint("keep them as text"),
            dataset=dataset,
            column=plan.name,
        )
    if plan.kind in ("time", "bool"):
        return convert_column(column, plan, dataset, zero_dates)  # checks a day's range
    if column.type.equals(target):
        return column
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} came as "
            f"{column.type}, which does not fit {target}",
            hint=plan.cast_hint(),
            dataset=dataset,
            column=plan.name,
        ) from None
