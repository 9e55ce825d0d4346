"""MariaDB/MySQL types to Arrow: the mapping, the SELECT expressions, the batch conversion.

The mapping is decided from ``information_schema.COLUMNS`` before any row is
read, so every column's Arrow type is known up front. Values arrive as the
server's text (binary columns as bytes); each column of a fetched chunk
becomes one Arrow array through one vectorised cast, and a value that does
not fit raises :class:`~combined.errors.SchemaMismatch` naming the column.

==========================  ==========================  ==================================
MariaDB / MySQL             Arrow                       notes
==========================  ==========================  ==================================
tinyint/smallint            int8/int16                  ``tinyint(1)`` (BOOLEAN) stays int8:
mediumint/int/bigint        int32/int32/int64           the server does not restrict it to 0/1
... UNSIGNED                uint8/16/32/32/64           the lake stores uint64 as
                                                        decimal(20,0) (Delta has no unsigned)
decimal(p,s), p <= 38       decimal128(p,s)             exact
decimal(p,s), 38 < p <= 65  decimal256(p,s)             exact (the lake keeps it as text)
float / double              float32 / float64           exact: FLOAT is read widened to
                                                        DOUBLE (its own text has 6 digits)
bit(1)                      bool
bit(n), n > 1               uint64                      the bits as an unsigned number
char/varchar/*text          string                      utf8mb4 (the session's charset)
enum / set                  string                      the label(s)
json                        string                      the JSON text (MariaDB: a longtext)
uuid / inet4 / inet6        string                      MariaDB's canonical text
binary/varbinary/*blob      binary                      as stored (binary(n) keeps padding)
date                        date32
time(fsp)                   time64[us]                  outside 00:00:00..23:59:59.999999
                                                        (MySQL allows -838:59:59..838:59:59)
                                                        raises; cast it to text
datetime(fsp)               timestamp[us]               no zone, as stored
timestamp(fsp)              timestamp[us, tz=UTC]       the session runs at time_zone +00:00
year                        int16                       YEAR 0000 is 0
geometry types, others      unsupported                 UnsupportedType, unless cast to text
==========================  ==========================  ==================================

Zero dates (``0000-00-00``, or a zero month or day where ``NO_ZERO_IN_DATE``
is off) are not dates: a read that meets one raises SchemaMismatch naming the
column, unless the read's ``zero_dates`` policy is ``null`` (each such value
becomes a null) or the column is cast to text (``0000-00-00`` is kept).

A declared cast (``casts = {column: "text"}``) reads a column as text: the
server's ``CAST(col AS CHAR)``, or ``ST_AsText(col)`` for a geometry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from combined.connectors._shared import cast_key
from combined.connectors.mariadb._connect import ZeroDates, quote_ident
from combined.errors import ConfigError, SchemaMismatch

Kind = Literal[
    "int", "decimal", "float", "bool", "bits", "string", "binary", "date", "time", "datetime", "ts"
]

_INTS = {
    "tinyint": (pa.int8(), pa.uint8()),
    "smallint": (pa.int16(), pa.uint16()),
    "mediumint": (pa.int32(), pa.uint32()),
    "int": (pa.int32(), pa.uint32()),
    "integer": (pa.int32(), pa.uint32()),
    "bigint": (pa.int64(), pa.uint64()),
}
_STRINGS = {
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
    "enum",
    "set",
    "json",
    "uuid",
    "inet4",
    "inet6",
}
_BINARIES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_GEOMETRIES = {
    "geometry",
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
    "geomcollection",
}
_DAY_US = 86_400_000_000
#: A string or binary column declared longer than this is measured row by row as it is fetched.
WIDE_OCTETS = 8192
# A date part whose month or day is 00: what MariaDB/MySQL call zero dates.
_ZERO_DATE = r"^\d{4}-(00-\d{2}|\d{2}-00)"


@dataclass(frozen=True, slots=True)
class SourceColumn:
    """One ``information_schema.COLUMNS`` row, as much as the mapping needs."""

    name: str
    data_type: str
    column_type: str
    nullable: bool
    precision: int | None
    scale: int | None
    default: str | None = None
    extra: str = ""
    octets: int | None = None
    #: ``ORDINAL_POSITION``: a column the account may not read (a column grant) still counts.
    position: int | None = None


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one column is selected, typed and converted."""

    name: str
    source_type: str
    kind: Kind | None
    arrow_type: pa.DataType | None
    expr: str
    nullable: bool = True
    reason: str | None = None
    #: The most bytes a value of a string or binary column holds (None: unknown or fixed).
    octets: int | None = None
    #: The table it belongs to, when known: how a cast of it is named in the source's config.
    table: str | None = None

    @property
    def arrow_type_text(self) -> str:
        """The Arrow type as discovery reports it (``unsupported`` when none)."""
        return "unsupported" if self.arrow_type is None else str(self.arrow_type)

    @property
    def orderable(self) -> bool:
        """Whether the column can bound and order a cursor read (numbers and time)."""
        return self.kind in ("int", "decimal", "float", "date", "datetime", "ts")

    @property
    def temporal(self) -> bool:
        """Whether the column holds dates or timestamps."""
        return self.kind in ("date", "datetime", "ts")

    def cast_hint(self, to: str = "read the text the server writes") -> str:
        """How to read the column as text instead: the source's ``casts`` entry naming it."""
        key = cast_key(self.table or "<table>", self.name, "`")
        return f'declare casts: {{{key}: "text"}} in the source\'s config to {to}'

    @property
    def keyable(self) -> bool:
        """Whether values of the column have an order keyset pages can use."""
        return self.orderable or self.kind in ("string", "binary", "bool", "bits", "time")


def plan_column(col: SourceColumn, cast: str | None = None) -> ColumnPlan:
    """Decide how ``col`` is read (see the module table)."""
    q = quote_ident(col.name)
    dt = col.data_type.lower()
    source = col.column_type
    if cast is not None:
        if cast.strip().lower() != "text":
            raise ConfigError(
                f"the cast {cast!r} of column {col.name!r} is not supported",
                hint='declare "text" to read the column as the server writes it',
                column=col.name,
            )
        expr = f"ST_AsText({q})" if dt in _GEOMETRIES else f"CAST({q} AS CHAR)"
        return ColumnPlan(col.name, source, "string", pa.string(), expr, col.nullable)
    unsigned = "unsigned" in source.lower()
    if dt in _INTS:
        arrow = _INTS[dt][1 if unsigned else 0]
        return ColumnPlan(col.name, source, "int", arrow, q, col.nullable)
    if dt == "year":
        return ColumnPlan(col.name, source, "int", pa.int16(), q, col.nullable)
    if dt in ("decimal", "numeric"):
        p, s = col.precision or 10, col.scale or 0
        arrow = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
        return ColumnPlan(col.name, source, "decimal", arrow, q, col.nullable)
    if dt == "float":
        # The server writes a FLOAT with 6 significant digits (16777216 becomes
        # 1.67772e7); widened to DOUBLE it writes the exact value.
        expr = f"CAST({q} AS DOUBLE)"
        return ColumnPlan(col.name, source, "float", pa.float32(), expr, col.nullable)
    if dt in ("double", "real", "double precision"):
        return ColumnPlan(col.name, source, "float", pa.float64(), q, col.nullable)
    if dt == "bit":
        # b'..' comes as raw bytes; +0 makes the server write the number.
        if (col.precision or 1) == 1:
            return ColumnPlan(col.name, source, "bool", pa.bool_(), f"({q} + 0)", col.nullable)
        return ColumnPlan(col.name, source, "bits", pa.uint64(), f"({q} + 0)", col.nullable)
    if dt in _STRINGS:
        return ColumnPlan(
            col.name, source, "string", pa.string(), q, col.nullable, octets=col.octets
        )
    if dt in _BINARIES:
        return ColumnPlan(
            col.name, source, "binary", pa.binary(), q, col.nullable, octets=col.octets
        )
    if dt == "date":
        return ColumnPlan(col.name, source, "date", pa.date32(), q, col.nullable)
    if dt == "datetime":
        return ColumnPlan(col.name, source, "datetime", pa.timestamp("us"), q, col.nullable)
    if dt == "timestamp":
        arrow = pa.timestamp("us", tz="UTC")
        return ColumnPlan(col.name, source, "ts", arrow, q, col.nullable)
    if dt == "time":
        # Microseconds since midnight, written by the server: Arrow cannot
        # parse time text, and a negative or 24h+ duration must be seen.
        expr = f"CAST(TIME_TO_SEC({q}) * 1000000 AS SIGNED)"
        return ColumnPlan(col.name, source, "time", pa.time64("us"), expr, col.nullable)
    return ColumnPlan(
        col.name, source, None, None, q, col.nullable, reason=f"no faithful arrow type for {dt}"
    )


@dataclass(frozen=True, slots=True)
class Layout:
    """The select list of a read and the conversion of its fetched chunks."""

    plans: tuple[ColumnPlan, ...]
    schema: pa.Schema
    zero_dates: ZeroDates = "error"

    @classmethod
    def of(cls, plans: Sequence[ColumnPlan], zero_dates: ZeroDates = "error") -> Layout:
        """The layout of ``plans`` (every one must be supported)."""
        schema = pa.schema([pa.field(p.name, p.arrow_type) for p in plans])
        return cls(tuple(plans), schema, zero_dates)

    @property
    def wide(self) -> tuple[int, ...]:
        """The positions of the columns whose values may be long: measured as rows are fetched.

        A string or binary column declared longer than :data:`WIDE_OCTETS`
        bytes (or of no known length: a cast, a geometry's text): one row of
        a ``LONGBLOB`` may hold more than a whole batch should.
        """
        return tuple(
            i
            for i, p in enumerate(self.plans)
            if p.kind in ("string", "binary") and (p.octets is None or p.octets > WIDE_OCTETS)
        )

    def select_list(self) -> str:
        """The SQL select list, one expression per column, named as the column."""
        return ", ".join(f"{p.expr} AS {quote_ident(p.name)}" for p in self.plans)

    def convert(self, rows: Sequence[Sequence[Any]], dataset: str) -> pa.RecordBatch:
        """Turn fetched rows (server text) into one batch of :attr:`schema`, or raise."""
        if not rows:
            return pa.RecordBatch.from_arrays(
                [pa.array([], p.arrow_type) for p in self.plans], schema=self.schema
            )
        columns = list(zip(*rows, strict=True))
        arrays = [
            convert_column(columns[i], plan, dataset, self.zero_dates)
            for i, plan in enumerate(self.plans)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def convert_column(
    values: Sequence[Any] | pa.Array,
    plan: ColumnPlan,
    dataset: str,
    zero_dates: ZeroDates = "error",
) -> pa.Array:
    """One column of server text as an Arrow array of ``plan.arrow_type``."""
    target = plan.arrow_type
    assert target is not None and plan.kind is not None
    if isinstance(values, pa.Array):  # the bulk path's columns are Arrow already
        text = values
        if plan.kind == "binary":
            return text
    elif plan.kind == "binary":
        return pa.array(values, pa.binary())
    else:
        text = pa.array(values, pa.string())
    if plan.kind == "string":
        return text
    try:
        if plan.kind == "bool":
            return text.cast(pa.int8()).cast(pa.bool_())
        if plan.kind == "time":
            micros = text.cast(pa.int64())
            _check_time(micros, plan, dataset)
            return micros.cast(target)
        if plan.temporal:
            return _temporal(text, plan, dataset, zero_dates)
        return text.cast(target)
    except pa.ArrowInvalid:
        bad = _first_unparsable(text, target)
        raise SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} holds "
            f"{bad!r}, which {target} cannot hold",
            hint=plan.cast_hint(),
            dataset=dataset,
            column=plan.name,
        ) from None


def _temporal(text: pa.Array, plan: ColumnPlan, dataset: str, zero_dates: ZeroDates) -> pa.Array:
    target = plan.arrow_type
    assert target is not None
    naive = pa.date32() if plan.kind == "date" else pa.timestamp("us")
    try:
        out = text.cast(naive)
    except pa.ArrowInvalid:
        zero = pc.fill_null(pc.match_substring_regex(text, _ZERO_DATE), False)
        if not pc.any(zero).as_py():
            raise
        if zero_dates != "null":
            raise SchemaMismatch(
                f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} holds the "
                f"zero date {pc.filter(text, zero)[0].as_py()!r}, which is not a date",
                hint="set zero_dates: null to read zero dates as nulls, or "
                + plan.cast_hint("keep them as text"),
                dataset=dataset,
                column=plan.name,
            ) from None
        out = pc.if_else(zero, pa.scalar(None, pa.string()), text).cast(naive)
    return out if naive.equals(target) else out.cast(target)


def zero_date_key_hint(
    plans: Mapping[str, ColumnPlan], columns: Sequence[str], zero_dates: ZeroDates, *, casts: bool
) -> str | None:
    """Why key ``columns`` hold NULL in rows sharing a key, when this read made zero dates
    NULL (``zero_dates: null``) in a date or timestamp one of them; else None.

    Two different zero dates (``0000-00-00``, ``2020-00-05``) then become one
    key, and the capture refuses them as duplicates. ``casts`` says whether
    the dataset may cast (a cdc dataset takes none).
    """
    dated = [plans[c] for c in columns if c in plans and plans[c].temporal]
    if zero_dates != "null" or not dated:
        return None
    names = " and ".join(repr(p.name) for p in dated)
    held = "NULL or zero dates" if any(p.nullable for p in dated) else "zero dates"
    ways = [
        f"declare a key without {held}",
        "set zero_dates: error (a read then stops at the first zero date, naming it)",
    ]
    if casts:
        ways.append(dated[0].cast_hint("keep each zero date as its own text"))
    return (
        f"key column {names} holds {held}, and zero_dates: null reads every zero date "
        "('0000-00-00', or a zero month or day) as NULL, so different ones make one key: "
        + ", or ".join(ways)
    )


def _check_time(micros: pa.Array, plan: ColumnPlan, dataset: str) -> None:
    if micros.null_count == len(micros):
        return
    low, high = pc.min_max(micros).values()
    if low.as_py() < 0 or high.as_py() >= _DAY_US:
        worst = low.as_py() if low.as_py() < 0 else high.as_py()
        raise SchemaMismatch(
            f"column {plan.name!r} ({plan.source_type}) of dataset {dataset!r} holds a "
            f"duration of {worst / 1e6:g} seconds, not a time of day",
            hint=plan.cast_hint(),
            dataset=dataset,
            column=plan.name,
        )


def _first_unparsable(text: pa.Array, target: pa.DataType) -> Any:
    # Only on the error path: find the value to name, one at a time.
    for value in text.to_pylist():
        if value is None:
            continue
        try:
            pa.array([value], pa.string()).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return value
    return None


def typed_value(text: Any, plan: ColumnPlan) -> Any:
    """One value of the column's server text (``MAX(col)``, a state) as a Python value."""
    if text is None:
        return None
    return convert_column([text], plan, "cursor bound")[0].as_py()


def state_value(value: Any) -> Any:
    """A cursor value as JSON: ISO-8601 text for dates and times, exact text for decimals."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def from_state(value: Any, plan: ColumnPlan) -> Any:
    """A checkpoint's JSON value back as the column's Python value."""
    if isinstance(value, str) and plan.kind == "ts":
        return datetime.fromisoformat(value)
    if isinstance(value, str) and plan.kind == "datetime":
        return datetime.fromisoformat(value)
    if isinstance(value, str) and plan.kind == "date":
        return date.fromisoformat(value)
    if isinstance(value, str | int | float) and plan.kind == "decimal":
        return Decimal(str(value))
    if isinstance(value, str) and plan.kind == "int":
        return int(value)
    return value


def holds(wide: pa.DataType | None, narrow: pa.DataType | None) -> bool:
    """Whether every value of ``narrow`` is one of ``wide``, which holds more (an integer of
    more bits, a decimal of more digits on each side of the point)."""
    if wide is None or narrow is None or wide == narrow:
        return False
    if pa.types.is_integer(wide) and pa.types.is_integer(narrow):
        signed = pa.types.is_signed_integer(wide)
        if signed == pa.types.is_signed_integer(narrow):
            return bool(wide.bit_width > narrow.bit_width)
        return bool(signed and wide.bit_width > narrow.bit_width)
    if pa.types.is_decimal(wide) and pa.types.is_decimal(narrow):
        digits = wide.precision - wide.scale >= narrow.precision - narrow.scale
        return bool(digits and wide.scale >= narrow.scale)
    return False
