"""PostgreSQL types to Arrow: the mapping, the SELECT expressions, the batch conversion.

The mapping is decided from the catalog before any row is read, so every
column's Arrow type is known up front and every batch is checked against it.
Three routes, chosen per column:

* ``native``: the ADBC driver decodes the binary COPY value itself;
* ``text``: the server writes the value's canonical text (``col::text``),
  used where Arrow has no faithful type (see below);
* ``decimal``: the server writes ``col::text`` and pyarrow casts it to a
  decimal, vectorised and exact (a value that does not fit raises).

=========================  ==============================  ==============================
PostgreSQL                 Arrow                           why / how
=========================  ==============================  ==============================
boolean                    bool                            native
smallint/integer/bigint    int16/int32/int64               native
real/double precision      float32/float64                 native (NaN, +-Infinity kept)
numeric(p,s), p<=38        decimal128(p,s)                 text -> cast; NaN raises
numeric(p,s), 38<p<=76     decimal256(p,s)                 text -> cast; NaN raises;
                                                           s < 0 as (p-s, 0), s > p as
                                                           (s, s) (decimal_type)
numeric (no typmod), p>76  string (PostgreSQL text)        no fixed scale exists, so any
                                                           decimal would round or fail
                                                           on a later value; text is exact
text/varchar/char(n)/name  string                          native (char(n) keeps padding);
                                                           "char" as its text
bytea                      binary                          native
date                       date32                          native; +-infinity as the day
                                                           counts +-(2**31-1), as DuckDB
time                       time64[us]                      native; 24:00:00 raises
timetz                     string                          Arrow has no time-with-offset
timestamp                  timestamp[us]                   native; +-infinity as the counts
                                                           +-(2**63-1), as DuckDB
timestamptz                timestamp[us, tz=UTC]           native; +-infinity as timestamp
interval                   month_day_nano_interval         native; a time part beyond
                                                           +-292 years overflows
                                                           nanoseconds and raises
uuid                       string (lower-case, hyphens)    Delta Lake has no uuid or
                                                           fixed-size binary type
json/jsonb                 string (the JSON text)          the driver's json extension
                                                           type unwrapped to its storage
enum                       string (the label)              text
inet/cidr/macaddr(8)       string                          canonical text
xml, bit/varbit, pg_lsn    string                          canonical text
other string types         string                          text (e.g. citext)
oid                        int64                           unsigned 32-bit needs 64 bits
domain                     its base type                   cast to the base type
T[] (one dimension)        list<T mapping>                 multi-dimensional raises
money, ranges, geometric,  unsupported                     UnsupportedType naming the
tsvector, composite, ...                                   column, unless a cast is declared
=========================  ==============================  ==============================

A declared cast (the source's ``casts: {"table.column": "text"}`` or
``"numeric(p,s)"``, or a read's ``options["casts"] = {column: ...}``)
replaces the mapping for that column. Array
lower bounds other than 1 are not kept: the list holds the elements in order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from combined.connectors._shared import cast_key
from combined.connectors.postgres._text import DATE_INFINITY, TIMESTAMP_INFINITY
from combined.errors import ConfigError, SchemaMismatch

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, MONEY = 114, 142, 700, 701, 790
CIDR, MACADDR8, MACADDR, INET = 650, 774, 829, 869
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL = (
    1042,
    1043,
    1082,
    1083,
    1114,
    1184,
    1186,
)
TIMETZ, BIT, VARBIT, NUMERIC, UUID, PG_LSN, JSONB, JSONPATH = (
    1266,
    1560,
    1562,
    1700,
    2950,
    3220,
    3802,
    4072,
)

# Types the driver decodes itself, with the Arrow type it produces and the SQL
# name to cast a domain over them to (no typmod: the cast must be lossless).
_NATIVE: dict[int, tuple[pa.DataType, str]] = {
    BOOL: (pa.bool_(), "boolean"),
    INT2: (pa.int16(), "smallint"),
    INT4: (pa.int32(), "integer"),
    INT8: (pa.int64(), "bigint"),
    FLOAT4: (pa.float32(), "real"),
    FLOAT8: (pa.float64(), "double precision"),
    TEXT: (pa.string(), "text"),
    VARCHAR: (pa.string(), "varchar"),
    BPCHAR: (pa.string(), "bpchar"),
    NAME: (pa.string(), "name"),
    BYTEA: (pa.binary(), "bytea"),
    DATE: (pa.date32(), "date"),
    TIME: (pa.time64("us"), "time"),
    TIMESTAMP: (pa.timestamp("us"), "timestamp"),
    TIMESTAMPTZ: (pa.timestamp("us", tz="UTC"), "timestamptz"),
    INTERVAL: (pa.month_day_nano_interval(), "interval"),
    JSON: (pa.string(), "json"),
    JSONB: (pa.string(), "jsonb"),
}
# "char" too: the driver reads its empty value (a zero byte) as "\x00", its text is ''.
_AS_TEXT = {UUID, INET, CIDR, MACADDR, MACADDR8, XML, BIT, VARBIT, TIMETZ, PG_LSN, JSONPATH, CHAR}
_INT_TYPES = {INT2, INT4, INT8}
# The text of a value is its type's output, as a change stream sends it. inet's
# cast to text is a function of its own that adds the mask (`::1/128` for `::1`);
# a cast to `name` has none, so it is the output (an inet's text fits in `name`).
_VIA_NAME = {INET}
# xml's cast to text is the stored text, while its output drops a declaration
# of version 1.0 alone (`<?xml version="1.0"?><a/>` is `<a/>`): `format` gives
# the output, and an array's text (its elements' outputs) is read back as text[].
_VIA_OUTPUT = {XML}


def _as_text(col: sql.Composable, base_oid: int, array: str = "") -> sql.Composable:
    """``col`` as its type's output text (``array="[]"``: an array's elements)."""
    if base_oid in _VIA_NAME:
        return sql.SQL(f"CAST(CAST({{}} AS name{array}) AS text{array})").format(col)
    if base_oid in _VIA_OUTPUT and array:
        return sql.SQL("CAST(CAST({} AS text) AS text[])").format(col)
    if base_oid in _VIA_OUTPUT:
        return sql.SQL("CASE WHEN {0} IS NOT NULL THEN format('%s', {0}) END").format(col)
    return sql.SQL(f"CAST({{}} AS text{array})").format(col)


_TIME_TYPES = {DATE, TIMESTAMP, TIMESTAMPTZ}

# PostgreSQL's earliest timestamp (4714-11-24 BC) in Unix microseconds and
# days. Anything below is +-infinity or a value the driver's epoch shift
# overflowed, never a real instant.
_PG_MIN_US = -210_866_803_200_000_000
_PG_MIN_DAYS = -2_440_588
_DAY_US = 86_400_000_000

# PostgreSQL stores a date's infinities as int32's maximum and minimum days
# since 2000-01-01, a timestamp's as int64's microseconds; the driver moves
# every count to 1970 (10957 days later), which wraps both to values below
# any real one. Each check: the counts' type, PostgreSQL's first day, the
# driver's +infinity and -infinity, and the count DuckDB reads as infinity.
_PG_EPOCH_DAYS = 10_957
_PG_EPOCH_US = _PG_EPOCH_DAYS * _DAY_US
_INFINITIES: dict[str, tuple[pa.DataType, int, tuple[int, int], int]] = {
    "date": (
        pa.int32(),
        _PG_MIN_DAYS,
        (DATE_INFINITY + _PG_EPOCH_DAYS - 2**32, -(2**31) + _PG_EPOCH_DAYS),
        DATE_INFINITY,
    ),
    "timestamp": (
        pa.int64(),
        _PG_MIN_US,
        (TIMESTAMP_INFINITY + _PG_EPOCH_US - 2**64, -(2**63) + _PG_EPOCH_US),
        TIMESTAMP_INFINITY,
    ),
}

_CAST_SPEC = re.compile(r"^\s*(text|numeric\s*\(\s*(\d+)\s*,\s*(-?\d+)\s*\))\s*$", re.IGNORECASE)

Route = Literal["native", "json", "decimal", "text", "unsupported"]
Check = Literal["timestamp", "date", "time"] | None


@dataclass(frozen=True, slots=True)
class PgType:
    """One ``pg_type`` row, as much as the mapping needs."""

    oid: int
    name: str
    typtype: str
    category: str
    basetype: int
    typmod: int
    elem: int


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one column is selected, typed and checked."""

    name: str
    source_type: str
    route: Route
    arrow_type: pa.DataType | None
    expr: sql.Composable
    is_list: bool = False
    check: Check = None
    ndims_check: bool = False
    reason: str | None = None
    base_oid: int = 0

    @property
    def arrow_type_text(self) -> str:
        """The Arrow type as discovery reports it (``unsupported`` when none)."""
        return "unsupported" if self.arrow_type is None else str(self.arrow_type)

    @property
    def orderable_number(self) -> bool:
        """Whether the column holds integers, decimals or floats."""
        return self.base_oid in _INT_TYPES | {NUMERIC, FLOAT4, FLOAT8} and not self.is_list

    @property
    def temporal(self) -> bool:
        """Whether the column holds dates or timestamps."""
        return self.base_oid in _TIME_TYPES and not self.is_list


@dataclass(frozen=True, slots=True)
class _Scalar:
    route: Route
    arrow: pa.DataType | None
    base_oid: int
    via_domain: bool
    reason: str | None = None


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric typmod, or None when unconstrained."""
    if typmod < 4:
        return None
    value = typmod - 4
    precision = (value >> 16) & 0xFFFF
    scale = ((value & 0x7FF) ^ 1024) - 1024  # scale may be negative since PostgreSQL 15
    return precision, scale


def decimal_type(precision: int, scale: int) -> pa.DataType | None:
    """The Arrow decimal holding every value of ``numeric(precision, scale)``; None past 76 digits.

    Since PostgreSQL 15 the scale may be negative (``numeric(5, -2)``:
    integers rounded to hundreds, up to 7 digits) or above the precision
    (``numeric(3, 5)``: five fractional digits, below 0.001). Their values
    are exactly those of ``decimal(p - s, 0)`` and ``decimal(s, s)``: the
    types DuckDB, Parquet and Delta hold, and the identity encodes.
    """
    if scale < 0:
        precision, scale = precision - scale, 0
    precision = max(precision, scale)
    if precision <= 38:
        return pa.decimal128(precision, scale)
    if precision <= 76:
        return pa.decimal256(precision, scale)
    return None


def _scalar(oid: int, typmod: int, types: Mapping[int, PgType], domain: bool = False) -> _Scalar:
    t = types.get(oid)
    if t is not None and t.typtype == "d":
        # A domain column's own typmod is -1; the domain carries its base's.
        return _scalar(t.basetype, t.typmod if t.typmod >= 0 else typmod, types, True)
    if oid == NUMERIC:
        pm = numeric_typmod(typmod)
        arrow = decimal_type(*pm) if pm else None
        if arrow is None:
            return _Scalar("text", pa.string(), oid, domain)
        return _Scalar("decimal", arrow, oid, domain)
    if oid in (JSON, JSONB):
        return _Scalar("json", pa.string(), oid, domain)
    if oid in _NATIVE:
        return _Scalar("native", _NATIVE[oid][0], oid, domain)
    if oid == OID:
        return _Scalar("native", pa.int64(), oid, True)  # cast to bigint, see _scalar_expr
    if oid in _AS_TEXT or (t is not None and (t.typtype == "e" or t.category == "S")):
        return _Scalar("text", pa.string(), oid, domain)
    name = t.name if t is not None else f"oid {oid}"
    return _Scalar("unsupported", None, oid, domain, f"no faithful arrow type for {name}")


def _base_sql(s: _Scalar) -> str:
    return "bigint" if s.base_oid == OID else _NATIVE[s.base_oid][1]


def plan_column(
    name: str,
    typoid: int,
    typmod: int,
    source_type: str,
    types: Mapping[int, PgType],
    cast: str | None = None,
) -> ColumnPlan:
    """Decide how column ``name`` of type ``typoid``/``typmod`` is read."""
    col = sql.Identifier(name)
    if cast is not None:
        return _cast_plan(name, source_type, col, cast)
    # Walk domains down to their base; a domain's typmod wins over the column's.
    t, mod, via_domain = types.get(typoid), typmod, False
    while t is not None and t.typtype == "d":
        via_domain, mod = True, (t.typmod if t.typmod >= 0 else mod)
        t = types.get(t.basetype)
    if t is not None and t.category == "A" and t.elem:
        elem = _scalar(t.elem, mod, types)
        return _array_plan(name, source_type, col, elem, via_domain or elem.via_domain)
    s = _scalar(typoid, typmod, types)
    check = _check_of(s.base_oid)
    if s.route == "unsupported":
        return ColumnPlan(name, source_type, "unsupported", None, col, reason=s.reason)
    if s.route in ("text", "decimal"):
        expr: sql.Composable = _as_text(col, s.base_oid)
    elif s.via_domain:
        expr = sql.SQL("CAST({} AS {})").format(col, sql.SQL(_base_sql(s)))
    else:
        expr = col
    return ColumnPlan(name, source_type, s.route, s.arrow, expr, check=check, base_oid=s.base_oid)


def _array_plan(
    name: str, source_type: str, col: sql.Identifier, elem: _Scalar, via_domain: bool
) -> ColumnPlan:
    if elem.route == "unsupported" or elem.arrow is None:
        return ColumnPlan(
            name, source_type, "unsupported", None, col, is_list=True, reason=elem.reason
        )
    if elem.route == "native" and not via_domain:
        expr: sql.Composable = col
    elif elem.route == "native":
        expr = sql.SQL("CAST({} AS {}[])").format(col, sql.SQL(_base_sql(elem)))
    else:  # json, text and decimal elements travel as text[]
        expr = _as_text(col, elem.base_oid, "[]")
    route: Route = "decimal" if elem.route == "decimal" else "native"
    arrow = elem.arrow
    if pa.types.is_decimal256(arrow):
        # No identity encodes a decimal of over 38 digits inside a list, and the lake
        # keeps such decimals as text anyway: the elements are read as their text.
        route, arrow = "native", pa.string()
    return ColumnPlan(
        name,
        source_type,
        route,
        pa.list_(arrow),
        expr,
        is_list=True,
        check=_check_of(elem.base_oid),
        ndims_check=True,
        base_oid=elem.base_oid,
    )


def _cast_plan(name: str, source_type: str, col: sql.Identifier, cast: str) -> ColumnPlan:
    m = _CAST_SPEC.match(cast) if isinstance(cast, str) else None
    if m is None:
        raise ConfigError(
            f"the cast {cast!r} of column {name!r} is not supported",
            hint='declare "text" or "numeric(p,s)"',
            column=name,
        )
    if m.group(2) is None:
        return ColumnPlan(
            name, source_type, "text", pa.string(), sql.SQL("CAST({} AS text)").format(col)
        )
    precision, scale = int(m.group(2)), int(m.group(3))
    arrow = decimal_type(precision, scale)
    if arrow is None or not 1 <= precision <= 1000 or abs(scale) > 1000:
        raise ConfigError(
            f"the cast {cast!r} of column {name!r} has no arrow decimal",
            hint="declare a precision of at most 76, or cast to text",
            column=name,
        )
    expr = sql.SQL("CAST(CAST({} AS numeric({}, {})) AS text)").format(
        col, sql.SQL(str(precision)), sql.SQL(str(scale))
    )
    return ColumnPlan(name, source_type, "decimal", arrow, expr, base_oid=NUMERIC)


def _check_of(oid: int) -> Check:
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        return "timestamp"
    if oid == DATE:
        return "date"
    if oid == TIME:
        return "time"
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    """The select list of a read and the conversion of its raw batches."""

    plans: tuple[ColumnPlan, ...]
    schema: pa.Schema

    @classmethod
    def of(cls, plans: Sequence[ColumnPlan]) -> Layout:
        """The layout of ``plans`` (every one must be supported)."""
        schema = pa.schema([pa.field(p.name, p.arrow_type) for p in plans])
        return cls(tuple(plans), schema)

    def select_list(self) -> sql.Composable:
        """The columns, then one hidden ``array_ndims`` column per array column."""
        items: list[sql.Composable] = [
            sql.SQL("{} AS {}").format(p.expr, sql.Identifier(p.name)) for p in self.plans
        ]
        for i, p in enumerate(self.plans):
            if p.ndims_check:
                items.append(
                    sql.SQL("array_ndims({}) AS {}").format(
                        sql.Identifier(p.name), sql.Identifier(f"__combined_ndims_{i}")
                    )
                )
        return sql.SQL(", ").join(items)

    def convert(self, raw: pa.RecordBatch, relation: str = "table") -> pa.RecordBatch:
        """Turn a driver batch of ``relation`` into the declared schema, vectorised, or raise."""
        columns: list[pa.Array] = []
        hidden = len(self.plans)
        for i, plan in enumerate(self.plans):
            arr = raw.column(i)
            if plan.ndims_check:
                _check_ndims(raw.column(hidden), plan, relation)
                hidden += 1
            columns.append(_convert(arr, plan, relation))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def named(self, error: SchemaMismatch, relation: str = "table") -> SchemaMismatch:
        """The driver's refusal of an array whose subscripts start at neither 0 nor 1,
        naming the array columns that can hold it (the driver names none); any other
        error as it is.

        It read "a value does not fit its arrow type ... ReadRecord failed at
        row 0: Array value with lower bound not in {0, 1}", with a cast hint of
        ``<table>.<column>`` for the user to fill in.
        """
        arrays = [p for p in self.plans if p.ndims_check]
        if not arrays or "lower bound" not in str(error.context.get("detail", "")):
            return error
        names = ", ".join(p.name for p in arrays)
        which = f"column {names!r}" if len(arrays) == 1 else f"one of the columns {names!r}"
        casts = ", ".join(f'{cast_key(relation, p.name)}: "text"' for p in arrays)
        return SchemaMismatch(
            f"{which} of {relation} holds an array whose subscripts start at neither "
            "0 nor 1 (such as '[5:6]={1,2}'): a list keeps the elements, not their subscripts",
            hint=f"declare casts: {{{casts}}} to keep the text form",
            column=names,
            detail=error.context.get("detail"),
        )


def _cast_hint(plan: ColumnPlan, relation: str) -> str:
    """The source option reading ``plan``'s column as text (``casts`` keys name the table)."""
    return f'declare casts: {{{cast_key(relation, plan.name)}: "text"}} to keep the text form'


def _convert(arr: pa.Array, plan: ColumnPlan, relation: str) -> pa.Array:
    assert plan.arrow_type is not None
    if isinstance(arr, pa.ExtensionArray):  # the driver's json extension type
        arr = arr.storage
    if plan.route == "decimal":
        try:
            arr = pc.cast(arr, plan.arrow_type)
        except pa.ArrowInvalid:
            raise SchemaMismatch(
                f"column {plan.name!r} ({plan.source_type}) holds NaN or infinity, "
                f"which {plan.arrow_type} cannot hold",
                hint=_cast_hint(plan, relation),
                column=plan.name,
            ) from None
    if not arr.type.equals(plan.arrow_type):
        raise SchemaMismatch(
            f"column {plan.name!r} arrived as {arr.type}, expected {plan.arrow_type}",
            hint="the driver changed its mapping; report it, or declare a cast to text",
            column=plan.name,
        )
    if plan.check in _INFINITIES:
        return _infinities(arr, plan, relation)
    if plan.check is not None:
        _check_range(arr, plan, relation)
    return arr


def _infinities(arr: pa.Array, plan: ColumnPlan, relation: str) -> pa.Array:
    """``arr`` (dates or timestamps, or lists of them) with the driver's wrapped
    infinities as the counts DuckDB reads as +-infinity (:data:`_INFINITIES`);
    any other count below PostgreSQL's first day raises."""
    if isinstance(arr, pa.ListArray):
        values = _infinities(arr.values, plan, relation)
        if values is arr.values:
            return arr
        return pa.ListArray.from_arrays(arr.offsets, values, type=arr.type, mask=arr.is_null())
    assert plan.check is not None
    width, first, wrapped, infinity = _INFINITIES[plan.check]
    counts = arr.view(width)
    low = pc.min(counts).as_py()
    if low is None or low >= first:
        return arr
    for driver, count in zip(wrapped, (infinity, -infinity), strict=True):
        counts = pc.if_else(pc.equal(counts, driver), pa.scalar(count, width), counts)
    # -infinity's count lies below every real value; nothing else may.
    below = pc.and_(pc.less(counts, first), pc.not_equal(counts, -infinity))
    if pc.any(below).as_py():
        _refuse(plan, relation, "a value arrow cannot hold")
    return counts.view(arr.type)


def _check_range(arr: pa.Array, plan: ColumnPlan, relation: str) -> None:
    values = pc.list_flatten(arr) if plan.is_list else arr
    if len(values) == 0 or values.null_count == len(values):
        return
    if pc.max(values.view(pa.int64())).as_py() >= _DAY_US:
        _refuse(plan, relation, "24:00:00")


def _refuse(plan: ColumnPlan, relation: str, what: str) -> NoReturn:
    raise SchemaMismatch(
        f"column {plan.name!r} ({plan.source_type}) holds {what}",
        hint=_cast_hint(plan, relation),
        column=plan.name,
    )


def _check_ndims(ndims: pa.Array, plan: ColumnPlan, relation: str) -> None:
    top = pc.max(ndims).as_py()
    if top is not None and top > 1:
        raise SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}) holds a {top}-dimensional array",
            hint=_cast_hint(plan, relation),
            column=plan.name,
        )


def value_from_text(text: str | None, plan: ColumnPlan, *, hint: str) -> Any:
    """A number, date or timestamp column's PostgreSQL text as a Python value.

    Reading aggregates as text keeps numerics exact and turns ``infinity``
    or a BC date into a clear error instead of a driver overflow; ``hint``
    says what the caller's user can do about such a value.
    """
    if text is None:
        return None
    try:
        oid = plan.base_oid
        if oid in _INT_TYPES:
            return int(text)
        if oid == NUMERIC:
            value = Decimal(text)
            if not value.is_finite():
                raise ValueError(text)
            return value
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == DATE:
            return date.fromisoformat(text)
        if oid in (TIMESTAMP, TIMESTAMPTZ):
            return datetime.fromisoformat(text)
    except ValueError:
        pass
    raise SchemaMismatch(
        f"column {plan.name!r} ({plan.source_type}) holds {text!r}, which cannot bound a read",
        hint=hint,
        column=plan.name,
    )


def jsonable(value: Any) -> Any:
    """A cursor value as JSON: ISO-8601 text for dates and times, exact text for decimals."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value
