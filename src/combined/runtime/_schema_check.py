"""Does a record fit the declared schema? Checked on every batch, by type family.

The declared schema is what the connector's discovery reports for the
dataset. Exact type equality would be too strict (a driver may hand over
``large_string`` for ``string``, or a zone spelled differently), so batches are
compared by family: a value fits when its family is the declared one, or a
lossless widening of it (an integer where a float or decimal is declared), or
when the whole column is null.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

import pyarrow as pa

from combined.errors import SchemaMismatch

_PREFIXES: tuple[tuple[str, str], ...] = (
    ("int", "integer"),
    ("uint", "integer"),
    ("halffloat", "float"),
    ("float", "float"),
    ("double", "float"),
    ("decimal", "decimal"),
    ("large_string", "string"),
    ("string", "string"),
    ("utf8", "string"),
    ("large_utf8", "string"),
    ("large_binary", "binary"),
    ("fixed_size_binary", "binary"),
    ("binary", "binary"),
    ("bool", "boolean"),
    ("date", "date"),
    ("timestamp", "timestamp"),
    ("time", "time"),
    ("duration", "duration"),
    ("month_day_nano_interval", "interval"),
    ("large_list", "list"),
    ("fixed_size_list", "list"),
    ("list", "list"),
    ("struct", "struct"),
    ("map", "map"),
    ("null", "null"),
)

#: Declared family -> families a value may arrive as without loss.
_WIDENS: Mapping[str, frozenset[str]] = {
    "float": frozenset({"integer"}),
    "decimal": frozenset({"integer"}),
}


def family(type_text: str) -> str | None:
    """The family of an Arrow type as text (``str(pa.DataType)``); None if unknown."""
    text = type_text.strip().lower()
    if text.startswith("dictionary<values="):
        return family(text[len("dictionary<values=") :])
    if text.startswith("extension<"):
        return None
    for prefix, fam in _PREFIXES:
        if text.startswith(prefix):
            return fam
    return None


def _type_family(t: pa.DataType) -> str | None:
    if pa.types.is_dictionary(t):
        return _type_family(t.value_type)
    return family(str(t))


#: The prefix of Combined's own columns (provenance and control): never a source's.
RESERVED_PREFIX = "_combined_"


def check_names(
    dataset: str,
    names: Sequence[str],
    *,
    control: Collection[str] = frozenset(),
    committed: Sequence[str] = (),
) -> None:
    """Raise SchemaMismatch when a source column cannot be stored under its own name.

    A name starting with ``_combined_`` (other than the ``control`` columns the
    reader itself adds) would be dropped from the payload or overwritten by
    provenance. Two names that differ only in case (in the read, or against
    the lake table's columns) are one column to Delta and to DuckDB.
    """
    lake = {n.lower(): n for n in committed if not n.startswith(RESERVED_PREFIX)}
    seen: dict[str, str] = dict(lake)
    for name in names:
        if name.startswith(RESERVED_PREFIX) and name not in control:
            raise SchemaMismatch(
                f"column {name!r} of dataset {dataset} starts with {RESERVED_PREFIX!r}, "
                "the prefix of the columns Combined adds: it would not be stored as read",
                hint="leave the column out (the dataset's `columns:` lists the ones to "
                "keep), or, from a database, capture a view that renames it; nothing was "
                "committed for this dataset",
                dataset=dataset,
                column=name,
            )
        other = seen.setdefault(name.lower(), name)
        if other != name and lake.get(name.lower()) == other and other not in names:
            raise _renamed_in_case(dataset, name, other)
        if other != name:
            raise SchemaMismatch(
                f"columns {other!r} and {name!r} of dataset {dataset} differ only in case, "
                "and the lake (Delta, DuckDB) does not tell them apart",
                hint="leave one of them out (the dataset's `columns:` lists the ones to "
                "keep), or, from a database, capture a view that renames it; nothing was "
                "committed for this dataset",
                dataset=dataset,
                column=name,
            )


def _renamed_in_case(dataset: str, name: str, lake: str) -> SchemaMismatch:
    """The lake's column, read again under another case: renamed only in case."""
    return SchemaMismatch(
        f"columns {lake!r} and {name!r} of dataset {dataset} differ only in case, and the "
        f"lake (Delta, DuckDB) does not tell them apart: {lake!r} is the lake's, no longer "
        f"read, so the source renamed it {name!r}",
        hint=f"rename the source column back to {lake!r}, or, from a database, capture a "
        f"view that names it {lake!r}; else `combined reset {dataset} --drop-table --reason "
        '"..."` starts the dataset afresh (its history is lost); nothing was committed for '
        "this dataset",
        dataset=dataset,
        column=name,
    )


def check_batch(dataset: str, batch: pa.RecordBatch, declared: Mapping[str, str] | None) -> None:
    """Raise SchemaMismatch when a column's values do not fit its declared type."""
    if not declared:
        return
    for field, column in zip(batch.schema, batch.columns, strict=True):
        want_text = declared.get(field.name)
        if want_text is None:
            continue  # a new field: drift policy decides, not this check
        want = family(want_text)
        got = _type_family(field.type)
        if want is None or got is None or got == want or got == "null":
            continue
        if got in _WIDENS.get(want, frozenset()):
            continue
        if column.null_count == len(column):
            continue
        raise SchemaMismatch(
            f"a record of {dataset} does not fit the declared schema: column "
            f"{field.name!r} is declared {want_text}, the record holds {field.type}",
            hint="fix the value in the source, or declare the column's type to match; "
            "nothing was committed for this dataset",
            dataset=dataset,
            column=field.name,
            declared=want_text,
            found=str(field.type),
        )


_SIMPLE: Mapping[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "halffloat": pa.float16(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "large_string": pa.string(),
    "binary": pa.binary(),
    "large_binary": pa.binary(),
    "date32[day]": pa.date32(),
    "date64[ms]": pa.date64(),
    "time64[us]": pa.time64("us"),
    "time64[ns]": pa.time64("ns"),
    "time32[ms]": pa.time32("ms"),
    "month_day_nano_interval": pa.month_day_nano_interval(),
}


def parse_type(text: str) -> pa.DataType:
    """The Arrow type a discovery reported as text; text when it cannot be read back."""
    t = text.strip()
    if t in _SIMPLE:
        return _SIMPLE[t]
    m = re.fullmatch(r"decimal(128|256)\((\d+),\s*(-?\d+)\)", t)
    if m:
        precision, scale = int(m[2]), int(m[3])
        return (pa.decimal128 if m[1] == "128" else pa.decimal256)(precision, scale)
    m = re.fullmatch(r"timestamp\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]", t)
    if m:
        return pa.timestamp(m[1], tz=m[2])
    m = re.fullmatch(r"(?:large_)?list<item:\s*(.+)>", t)
    if m:
        return pa.list_(parse_type(m[1]))
    return pa.string()
