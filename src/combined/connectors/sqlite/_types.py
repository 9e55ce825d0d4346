"""Declared SQLite column types, their Arrow types, and the guarded projection.

SQLite does not enforce declared types (outside ``STRICT`` tables): a column
declared ``INTEGER`` may hold text. The ADBC driver infers each result
column's Arrow type from the values of the *first* batch and then fails on a
later batch that disagrees, so a text column whose first batch is all NULL is
typed ``int64`` and breaks at the first string. It also silently widens mixed
batches (integers next to text become ``"1.000000e+00"``-style strings).

To get stable, faithful types without per-row Python objects, every column is
read through a guarded SQL expression whose storage class is fixed (never
NULL for non-integer kinds, so inference cannot go wrong), plus:

* a null indicator column for nullable non-integer columns, which restores
  the NULLs in Arrow with one vectorised ``if_else``;
* one ``__bad`` integer column that names the first column of the row whose
  value does not fit its declared type, and the storage class found there,
  so a misfit raises :class:`~combined.errors.SchemaMismatch` instead of
  being widened, nulled or guessed.

Type mapping (by SQLite's own affinity rules, section 3.1 of its datatype
page, checked in that order):

=========================================  ========  ==========================
declared type contains                     Arrow     values that fit
=========================================  ========  ==========================
``INT``                                    int64     integer
``CHAR``, ``CLOB``, ``TEXT``               string    text
``BLOB``                                   binary    blob, text (its bytes)
``REAL``, ``FLOA``, ``DOUB``               double    real, integer
``BOOL``                                   bool      integer 0 or 1
``DATE``, ``TIME``                         string    text, integer, real
no declared type, ``ANY``                  string    text, integer, real
anything else (``NUMERIC``, ``DECIMAL``)   string    integer, real
=========================================  ========  ==========================

``NUMERIC``/``DECIMAL`` become **string**: SQLite keeps integers of those
columns exactly (up to 2**63) and every other number as a double, so no single
Arrow numeric type holds both without loss (double drops integer digits past
2**53, int64 drops fractions). SQLite renders them as text losslessly
(integers exactly, doubles with up to 17 significant digits). Text in such a
column is not a number and does not fit.

Dates and times stay **string** as stored: SQLite has no date type, and its
date functions accept ISO-8601 text, Julian day reals and Unix-epoch integers
alike, so numbers in a ``DATE``/``TIMESTAMP`` column are kept, rendered as
text, rather than failing every capture of a source the user does not own.
Columns without a declared type (view expressions, ``ANY``) likewise become
text; a blob there does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from combined.errors import SchemaMismatch

Kind = Literal["int", "bool", "float", "text", "blob"]

#: Storage-class codes used inside the ``__bad`` column.
_CLASS_CODES = {"integer": 1, "real": 2, "text": 3, "blob": 4}
_NOT_BOOLEAN = 5
_FOUND = {
    1: "an integer",
    2: "a real",
    3: "a text value",
    4: "a blob",
    _NOT_BOOLEAN: "an integer other than 0 or 1",
}
#: Codes below pack (column position + 1) * _STRIDE + class code.
_STRIDE = 8

BAD_COLUMN = "__bad"


@dataclass(frozen=True, slots=True)
class ColumnType:
    """The Arrow type of a declared SQLite type and the storage classes that fit it."""

    kind: Kind
    arrow: Any
    accepts: tuple[str, ...]

    @property
    def arrow_name(self) -> str:
        """The Arrow type as text (``int64``, ``double``, ``string``)."""
        return str(self.arrow)

    @property
    def cursor_capable(self) -> bool:
        """Whether values of this type have an order a keyset cursor can use."""
        return self.kind in ("int", "float", "text")


def column_type(declared: str) -> ColumnType:
    """Map a declared SQLite column type to its Arrow type (see the module table)."""
    t = declared.upper()
    if "INT" in t:
        return ColumnType("int", pa.int64(), ("integer",))
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return ColumnType("text", pa.string(), ("text",))
    if "BLOB" in t:
        return ColumnType("blob", pa.binary(), ("blob", "text"))
    if "REAL" in t or "FLOA" in t or "DOUB" in t:
        return ColumnType("float", pa.float64(), ("integer", "real"))
    if "BOOL" in t:
        return ColumnType("bool", pa.bool_(), ("integer",))
    if "DATE" in t or "TIME" in t or t.strip() in ("", "ANY"):
        return ColumnType("text", pa.string(), ("integer", "real", "text"))
    return ColumnType("text", pa.string(), ("integer", "real"))


def quote_ident(name: str) -> str:
    """Quote an identifier for SQLite (double quotes, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one column is selected and turned back into its Arrow array."""

    name: str
    declared: str
    type: ColumnType
    nullable: bool

    @property
    def indicates_nulls(self) -> bool:
        """Whether a separate null indicator is selected (non-integer kinds only)."""
        return self.nullable and self.type.kind in ("float", "text", "blob")


def _in(classes: Sequence[str]) -> str:
    return ", ".join(f"'{c}'" for c in classes)


def _value_sql(q: str, ct: ColumnType) -> str:
    # Integer kinds may stay NULL: the driver's default inference is int64.
    # Other kinds never yield NULL, so the first batch always carries the type.
    if ct.kind in ("int", "bool"):
        return f"CASE WHEN typeof({q}) = 'integer' THEN {q} END"
    if ct.kind == "float":
        return f"CASE WHEN typeof({q}) IN ('integer', 'real') THEN CAST({q} AS REAL) ELSE 0.0 END"
    if ct.kind == "blob":
        return f"CASE WHEN typeof({q}) IN ('blob', 'text') THEN CAST({q} AS BLOB) ELSE x'' END"
    if ct.accepts == ("text",):
        return f"CASE WHEN typeof({q}) = 'text' THEN {q} ELSE '' END"
    return f"CASE WHEN typeof({q}) IN ({_in(ct.accepts)}) THEN CAST({q} AS TEXT) ELSE '' END"


def _misfit_sql(q: str, ct: ColumnType) -> str:
    if ct.kind == "bool":
        return f"NOT (typeof({q}) = 'null' OR (typeof({q}) = 'integer' AND {q} IN (0, 1)))"
    return f"typeof({q}) NOT IN ('null', {_in(ct.accepts)})"


def _class_sql(q: str, ct: ColumnType) -> str:
    integer = _NOT_BOOLEAN if ct.kind == "bool" else _CLASS_CODES["integer"]
    return (
        f"CASE typeof({q}) WHEN 'integer' THEN {integer} WHEN 'real' THEN 2 "
        f"WHEN 'text' THEN 3 ELSE 4 END"
    )


class Projection:
    """The guarded select list of a read and the conversion of its batches."""

    def __init__(self, columns: Sequence[ColumnPlan]) -> None:
        self.columns = tuple(columns)
        #: The Arrow schema every converted batch has.
        self.schema = pa.schema(
            [pa.field(c.name, c.type.arrow, nullable=c.nullable) for c in self.columns]
        )

    def select_list(self) -> str:
        """The SQL select list: values, null indicators, then the misfit code."""
        values: list[str] = []
        nulls: list[str] = []
        misfits: list[str] = []
        for i, col in enumerate(self.columns):
            q = quote_ident(col.name)
            values.append(f'{_value_sql(q, col.type)} AS "__c{i}"')
            if col.indicates_nulls:
                nulls.append(f'({q} IS NULL) AS "__n{i}"')
            code = (i + 1) * _STRIDE
            misfits.append(
                f"WHEN {_misfit_sql(q, col.type)} THEN {code} + {_class_sql(q, col.type)}"
            )
        bad = f'CASE {" ".join(misfits)} ELSE 0 END AS "{BAD_COLUMN}"'
        return ", ".join([*values, *nulls, bad])

    def convert(self, raw: Any, dataset: str) -> Any:
        """Turn one raw driver batch into a batch of :attr:`schema`, or raise on a misfit."""
        n = len(self.columns)
        bad = raw.column(raw.num_columns - 1)
        if raw.num_rows and pc.max(bad).as_py() > 0:
            first = pc.index(pc.greater(bad, 0), True).as_py()
            self._raise_misfit(int(bad[first].as_py()), dataset)
        arrays = []
        null_at = n
        for i, col in enumerate(self.columns):
            arr = raw.column(i)
            if col.indicates_nulls:
                is_null = pc.equal(raw.column(null_at), 1)
                null_at += 1
                arr = pc.if_else(is_null, pa.scalar(None, arr.type), arr)
            if arr.type != col.type.arrow:
                arr = arr.cast(col.type.arrow)
            if col.type.kind == "text":
                self._check_utf8(arr, col, dataset)
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _raise_misfit(self, code: int, dataset: str) -> None:
        col = self.columns[code // _STRIDE - 1]
        found = _FOUND.get(code % _STRIDE, "a value of another type")
        raise SchemaMismatch(
            f"column {col.name!r} of dataset {dataset!r} is declared "
            f"{col.declared or 'without a type'} but holds {found}",
            hint="sqlite does not enforce declared types: have the rows fixed at the source, "
            "or capture a view that casts the column",
            dataset=dataset,
            column=col.name,
            declared=col.declared,
            found=found,
        )

    @staticmethod
    def _check_utf8(arr: Any, col: ColumnPlan, dataset: str) -> None:
        # SQLite stores text bytes unchecked; invalid UTF-8 would poison every
        # later reader of the lake, so it is a misfit, found here in one C pass.
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            found = "text that is not valid utf-8"
            raise SchemaMismatch(
                f"column {col.name!r} of dataset {dataset!r} is declared "
                f"{col.declared or 'without a type'} but holds {found}",
                hint="have the rows fixed at the source, or declare the column blob",
                dataset=dataset,
                column=col.name,
                declared=col.declared,
                found=found,
            ) from None
