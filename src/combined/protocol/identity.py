"""Stable row identity and payload hashing under a versioned canonical encoding.

``_combined_id`` is the md5 of the canonical text of the declared key values;
``_combined_payload_hash`` is the md5 of the canonical text of the row payload.
The canonical text is defined here and in ``docs/identity.md`` (encoding
``c1``); it depends on the values only, never on DuckDB's ``hash()``, on a
locale or on how a library formats floats, so the same key gives the same id
on every machine and library version.

The hot path is SQL: :func:`identity_sql` and :func:`payload_hash_sql` build
DuckDB expressions that compute both columns vectorised. The ``*_python``
functions are a pure-Python reference of the same encoding, for documentation
and cross-checking only.

Each value is encoded as ``<tag><n>:<text>`` where ``<tag>`` is one ASCII
letter naming the value's family, ``<n>`` the decimal byte length of the UTF-8
``<text>``; a null is ``n0:``. The length prefix makes any concatenation of
encoded values parse back in exactly one way.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from combined.protocol._digest import HEX, Digest
from combined.protocol._identity_fast import FastTexts
from combined.protocol._identity_python import (
    content_id_python,
    identity_python,
    identity_text_python,
    payload_hash_python,
    payload_text_python,
)
from combined.protocol._identity_sql import (
    _checked_key,
    _field_type,
    _source_columns,
    canonical_sql,
    content_id_sql,
    identity_sql,
    identity_text_sql,
    narrowed_decimal_sql,
    payload_columns,
    payload_hash_sql,
    payload_text_sql,
    quote_ident,
)
from combined.protocol._identity_streamed import STREAMED_BYTES, streamed_payload_hash_sql
from combined.protocol._identity_types import (
    ID_COLUMN,
    IDENTITY_ENCODING,
    PAYLOAD_HASH_COLUMN,
    _kind,
)

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "ID_COLUMN",
    "IDENTITY_ENCODING",
    "PAYLOAD_HASH_COLUMN",
    "canonical_sql",
    "compute_identity",
    "compute_payload_hash",
    "content_id_python",
    "content_id_sql",
    "duckdb_compatible",
    "duckdb_scannable_schema",
    "identity_python",
    "identity_sql",
    "identity_text_python",
    "identity_text_sql",
    "payload_columns",
    "payload_hash_python",
    "payload_hash_sql",
    "payload_text_python",
    "payload_text_sql",
    "narrowed_decimal_sql",
    "quote_ident",
    "streamed_payload_hash_sql",
    "with_identity",
]


#: Nullable payload columns whose texts one statement builds at most (``_staged``).
STAGE_COLUMNS = 100

_QUERY_STARTS = ("select", "with", "from", "values", "table", "(")

# DuckDB type names (as DESCRIBE shows them) accepted for each family; a
# relation column of another family would silently encode differently.
_DUCKDB_FAMILIES: dict[str, tuple[str, ...]] = {
    "bool": ("BOOLEAN",),
    "int": ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT")
    + ("UINTEGER", "UBIGINT", "UHUGEINT"),
    "float": ("FLOAT", "DOUBLE"),
    "string": ("VARCHAR",),
    "json": ("VARCHAR", "JSON"),
    "binary": ("BLOB",),
    "uuid": ("UUID",),
    "date": ("DATE",),
    "timestamp": ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"),
    "timestamptz": ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ_NS"),
    "time": ("TIME", "TIME_NS"),
}


def _duckdb_type_fits(kind: str, duckdb_type: str) -> bool:
    if kind == "null":
        return True
    if kind == "decimal":
        return duckdb_type.startswith("DECIMAL(") or duckdb_type in _DUCKDB_FAMILIES["int"]
    if kind == "bigdecimal":
        return duckdb_type == "VARCHAR"  # its plain text (see duckdb_compatible)
    if kind == "list":
        return duckdb_type.endswith("]")
    if kind == "struct":
        return duckdb_type.startswith("STRUCT(")
    if kind == "map":
        return duckdb_type.startswith("MAP(")
    return duckdb_type in _DUCKDB_FAMILIES[kind]


def _as_relation(relation_sql: str) -> str:
    text = relation_sql.strip()
    if text.lower().startswith(_QUERY_STARTS) and not text.startswith("("):
        return f"({text})"
    return text


def with_identity(
    con: duckdb.DuckDBPyConnection,
    relation_sql: str,
    key: Sequence[str],
    schema: pa.Schema,
    payload_columns: Sequence[str] | None = None,
    digest: Digest = HEX,
) -> str:
    """A SELECT of ``relation_sql`` with ``_combined_id`` and ``_combined_payload_hash`` added.

    ``relation_sql`` is a table or view name (quoted as needed) or a query.
    ``payload_columns`` defaults to the source columns of ``schema``. ``con``
    is used to check, without reading rows, that every key and payload
    column exists with a DuckDB type of its Arrow type's family; existing
    ``_combined_id``/``_combined_payload_hash`` columns are replaced.
    ``digest`` is the format of both (``"binary"``: identity encoding v2).
    """
    relation = _as_relation(relation_sql)
    names = _source_columns(schema) if payload_columns is None else list(payload_columns)
    id_expr = identity_sql(key, schema, digest)
    hash_expr = payload_hash_sql(names, schema, digest)
    described = con.sql(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    actual = {str(row[0]): str(row[1]) for row in described}
    for name in dict.fromkeys([*key, *names]):
        if name not in actual:
            raise ValueError(f"column {name!r} is not in the relation {relation_sql!r}")
        arrow_type = _field_type(schema, name)
        if not _duckdb_type_fits(_kind(arrow_type, name), actual[name]):
            raise TypeError(
                f"column {name!r} is {actual[name]} in the relation but {arrow_type} in the schema"
            )
    replaced = [quote_ident(n) for n in (ID_COLUMN, PAYLOAD_HASH_COLUMN) if n in actual]
    star = f"* EXCLUDE ({', '.join(replaced)})" if replaced else "*"
    return (
        f"SELECT {star}, {id_expr} AS {quote_ident(ID_COLUMN)}, "
        f"{hash_expr} AS {quote_ident(PAYLOAD_HASH_COLUMN)} FROM {relation}"
    )


def _scannable_type(t: pa.DataType, top: bool = True) -> pa.DataType:
    """The type to cast ``t`` to before DuckDB scans it (values unchanged).

    A decimal of more than 38 digits (DuckDB holds no wider one) becomes its
    plain text at the top level (:func:`decimal_plain_text`); nested, it stays.
    """
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_decimal(t) and t.precision > 38:
        return pa.string() if top else t
    if pa.types.is_decimal(t) and not pa.types.is_decimal128(t):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.json":
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_scannable_type(t.value_type, False)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_scannable_type(t.value_type, False)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_scannable_type(t.value_type, False)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct(
            [
                t.field(i).with_type(_scannable_type(t.field(i).type, False))
                for i in range(t.num_fields)
            ]
        )
    if pa.types.is_map(t):
        return pa.map_(_scannable_type(t.key_type, False), _scannable_type(t.item_type, False))
    return t


def duckdb_scannable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types DuckDB cannot scan replaced by ones it can (see below)."""
    fields = [f.with_type(_scannable_type(f.type)) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def duckdb_compatible(table: pa.Table) -> pa.Table:
    """``table`` with the columns DuckDB cannot scan cast to types it can, values unchanged.

    float16 becomes float32, decimal32/64/256 (precision up to 38) become
    decimal128 and JSON becomes its string storage, also inside lists,
    structs and maps; the canonical encoding of each value stays the same.
    """
    target = duckdb_scannable_schema(table.schema)
    if target == table.schema:
        return table
    columns = [
        decimal_plain_text(column)
        if pa.types.is_decimal(column.type) and pa.types.is_string(field.type)
        else column.cast(field.type)
        for column, field in zip(table.columns, target, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=target)


def decimal_plain_text(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Decimals as plain text with their type's scale (``0.0000001000``), never an exponent.

    Arrow's own cast writes small values with an exponent (``1.000E-7``).
    Python's decimal formatting is exact and plain; it runs a value at a time,
    which only decimals of more than 38 digits, rare and never a hot path, take.
    """
    values = column.to_pylist()
    return pa.array([None if v is None else format(v, "f") for v in values], pa.string())


def compute_identity(
    data: pa.Table | pa.RecordBatch,
    key: Sequence[str],
    payload_columns: Sequence[str] | None = None,
    *,
    con: duckdb.DuckDBPyConnection | None = None,
    digest: Digest = HEX,
) -> tuple[pa.Array, pa.Array]:
    """Compute ``_combined_id`` and ``_combined_payload_hash`` for every row of ``data``.

    The work runs vectorised in DuckDB over the Arrow data: on ``con`` when
    given, else on an in-memory connection kept per thread. The two arrays
    are in input order: strings of 32 hex digits, or with ``digest="binary"``
    (identity encoding v2) the 16 digest bytes. ``payload_columns`` defaults
    to the source columns (names not starting with ``_combined_``).
    """
    ids, hashes = _computed(data, _checked_key(key), payload_columns, con, digest)
    assert ids is not None
    return ids, hashes


def compute_payload_hash(
    data: pa.Table | pa.RecordBatch,
    payload_columns: Sequence[str] | None = None,
    *,
    con: duckdb.DuckDBPyConnection | None = None,
    digest: Digest = HEX,
) -> pa.Array:
    """``_combined_payload_hash`` of every row of ``data`` alone (a table without a key).

    As :func:`compute_identity`, without the ids: a keyless table's ids
    number equal rows, which takes the whole capture (docs/identity.md, section 9).
    """
    return _computed(data, [], payload_columns, con, digest)[1]


def _computed(
    data: pa.Table | pa.RecordBatch,
    key: list[str],
    payload_columns: Sequence[str] | None,
    con: duckdb.DuckDBPyConnection | None,
    digest: Digest,
) -> tuple[pa.Array | None, pa.Array]:
    """The ids (None without a ``key``) and payload hashes of ``data``'s rows."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    names = _source_columns(table.schema) if payload_columns is None else list(payload_columns)
    used = list(dict.fromkeys([*key, *names]))
    schema = pa.schema([table.schema.field(_field_index(table.schema, n)) for n in used])
    columns = duckdb_compatible(table.select(used)).columns
    ordinal = "__combined_identity_ordinal"
    if ordinal in used:
        raise ValueError(f"column name {ordinal!r} is reserved")
    con = con if con is not None else _thread_connection()
    # Build the SQL first: an unsupported type fails before any data moves.
    texts, outer = _hashes_sql(con, key, names, schema, columns, used, digest)
    order = None
    # A projection of one table keeps its rows' order when the connection
    # preserves insertion order (DuckDB's default); otherwise the rows are
    # numbered and sorted back, which costs about a tenth of the hashing.
    (preserved,) = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0]
    if preserved:
        scan = pa.Table.from_arrays(columns, names=used)
    else:
        # A vectorised 0..n-1.
        ones = pa.nulls(table.num_rows, pa.int64()).fill_null(1)
        positions = pc.subtract(pc.cumulative_sum(ones), 1)
        scan = pa.Table.from_arrays([*columns, positions], names=[*used, ordinal])
        order = ordinal
    if texts is not None and order is None and texts.nullable() > STAGE_COLUMNS:
        ids, hashes = _staged(con, texts, scan, "md5" if digest == HEX else "md5_number")
        return (None if ids is None else _digests(ids, digest, texts)), _digests(
            hashes, digest, texts
        )
    view = f"__combined_identity_{uuid.uuid4().hex}"
    con.register(view, scan)
    try:
        if texts is None:
            sql = f"SELECT {', '.join(outer)} FROM {quote_ident(view)}"
            result = con.sql(
                sql + (f" ORDER BY {quote_ident(order)}" if order else "")
            ).to_arrow_table()
        else:
            result = con.sql(texts.select(outer, quote_ident(view), order)).to_arrow_table()
    finally:
        con.unregister(view)
    columns = [_digests(result.column(n), digest, texts) for n in result.column_names]
    return (columns[0] if key else None), columns[-1]


def _digests(column: pa.ChunkedArray, digest: Digest, texts: FastTexts | None) -> pa.Array:
    """A result's digest column as the lake keeps it (hex text, or the 16 bytes)."""
    array = column.combine_chunks()
    if digest == HEX:
        return array.cast(pa.string())
    return array.cast(pa.binary()) if texts is None else _raw_digests(array)


def _staged(
    con: duckdb.DuckDBPyConnection, texts: FastTexts, scan: pa.Table, md5: str
) -> tuple[pa.ChunkedArray | None, pa.ChunkedArray]:
    """The ids and payload hashes of a payload of many nullable columns, built in stages.

    ``FastTexts.stages``: one statement over every column would hold DuckDB
    vectors for each node of its expression, a multiple of the columns
    whatever the rows (a nullable column's text takes a CASE: twice a
    column's nodes); a stage holds ``STAGE_COLUMNS`` columns' worth, and the
    text so far (a column of the batch's rows) between two. Not for a
    payload whose columns mostly hold no null: there the text so far weighs
    as much as the vectors it saves, and the statements cost ~10% more CPU.
    """
    acc = "__combined_acc"
    while acc in scan.column_names:
        acc += "_"
    view = f"__combined_identity_{uuid.uuid4().hex}"
    ids = result = None
    for i, statement in enumerate(texts.stages(md5, acc, STAGE_COLUMNS, quote_ident(view))):
        relation = scan if result is None else scan.append_column(acc, result.column(acc))
        con.register(view, relation)
        try:
            result = con.sql(statement).to_arrow_table()
        finally:
            con.unregister(view)
        if i == 0 and texts.key:
            ids = result.column("id")
    assert result is not None
    return ids, result.column("payload_hash")


def _hashes_sql(
    con: duckdb.DuckDBPyConnection,
    key: list[str],
    names: list[str],
    schema: pa.Schema,
    columns: Sequence[pa.Array | pa.ChunkedArray],
    used: list[str],
    digest: Digest,
) -> tuple[FastTexts | None, list[str]]:
    """The texts (None: the reference SQL) and the outer select of the ids and hashes."""
    if _streamed_bytes(columns, used, names):
        # Rows of large byte strings: their payload hashed in pieces (the reference SQL).
        outer = [f"{streamed_payload_hash_sql(con, names, schema, digest)} AS payload_hash"]
        if key:
            outer.insert(0, f"{identity_sql(key, schema, digest)} AS id")
        return None, outer
    # A column without a null in this batch skips its null test (same texts).
    nonnull = [n for n, c in zip(used, columns, strict=True) if c.null_count == 0]
    texts = FastTexts(key, names, schema, nonnull)
    # v2: md5_number's 128 bits reach Arrow as they are (_raw_digests), without
    # the 32 hex digits md5 prints and unhex would parse again.
    md5 = "md5" if digest == HEX else "md5_number"
    outer = [f"{md5}({texts.payload_text()}) AS payload_hash"]
    if key:
        outer.insert(0, f"{md5}({texts.identity_text()}) AS id")
    return texts, outer


def _streamed_bytes(
    columns: Sequence[pa.Array | pa.ChunkedArray],
    used: Sequence[str],
    payload: Sequence[str],
) -> bool:
    """Whether a row's byte strings among ``payload`` hold more than ``STREAMED_BYTES``.

    (Views and fixed sizes are not weighed: their rows keep the SQL.)
    """
    held = None
    for name, column in zip(used, columns, strict=True):
        t = column.type
        if name in payload and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            length = pc.fill_null(pc.binary_length(column), 0)
            held = length if held is None else pc.add(held, length)
    if held is None or not len(held):
        return False
    return bool(pc.max(held).as_py() > STREAMED_BYTES)


def _raw_digests(numbers: pa.Array) -> pa.Array:
    """md5_number's values as the 16 digest bytes each (binary), without a copy per value.

    DuckDB hands a UHUGEINT to Arrow as a 128-bit decimal holding its bits,
    which for md5_number are the md5 digest's 16 bytes in order; the
    buffer is read as fixed-size binary (tests check every byte against
    hashlib). Nothing here is null: every canonical text is a string.
    """
    if not pa.types.is_decimal128(numbers.type) or numbers.null_count:
        raise AssertionError(f"md5_number reached Arrow as {numbers.type}, not its 16 bytes")
    raw = pa.Array.from_buffers(
        pa.binary(16), len(numbers), [None, numbers.buffers()[1]], offset=numbers.offset
    )
    return raw.cast(pa.binary())


_local = threading.local()


def _thread_connection() -> duckdb.DuckDBPyConnection:
    # Opening a DuckDB connection costs tens of milliseconds, more than
    # hashing a typical batch; one empty in-memory database per thread (and
    # per process, as connections do not survive a fork) is reused instead.
    import duckdb

    cached = getattr(_local, "connection", None)
    if cached is None or cached[0] != os.getpid():
        cached = (os.getpid(), duckdb.connect(":memory:"))
        _local.connection = cached
    con: duckdb.DuckDBPyConnection = cached[1]
    return con


def _field_index(schema: pa.Schema, name: str) -> int:
    _field_type(schema, name)  # raises a clear error for missing or duplicate names
    return int(schema.get_field_index(name))
