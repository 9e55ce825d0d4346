"""Arrow types the lake stores: what every Delta reader understands."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def lake_type(t: pa.DataType) -> pa.DataType:
    """The Delta-compatible type a source Arrow type is stored as.

    Delta has no unsigned integers, no time of day, no interval and no
    nanosecond timestamps: unsigned ints widen (uint64 to decimal(20, 0)),
    times, intervals and decimals over 38 digits become exact text, timestamps are stored in
    microseconds (UTC when zoned).
    """
    if pa.types.is_dictionary(t):
        return lake_type(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if (
        pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    ):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(
            t.bit_width, pa.decimal128(20, 0)
        )
    if pa.types.is_time(t) or pa.types.is_interval(t) or pa.types.is_duration(t):
        return pa.string()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_decimal256(t):
        return pa.string()  # Delta stores at most 38 digits: keep the exact text
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(lake_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, lake_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(lake_type(t.key_type), lake_type(t.item_type))
    return t


def lake_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field stored as its lake type (all nullable)."""
    return pa.schema([pa.field(f.name, lake_type(f.type), True) for f in schema])


def unviewed(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its string and binary views as plain strings and binaries.

    The files delta-rs writes (a merge that evolves the schema) hold views,
    which most Arrow compute kernels (``is_in``, ``take``) do not take.
    """
    if not any(
        pa.types.is_string_view(t) or pa.types.is_binary_view(t) for t in batch.schema.types
    ):
        return batch
    return batch.cast(lake_schema(batch.schema))


def to_lake(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast a batch to ``schema`` (column order and types), vectorised."""
    import pyarrow.compute as pc

    from combined.protocol.identity import decimal_plain_text

    arrays = []
    for field in schema:
        idx = batch.schema.get_field_index(field.name)
        if idx < 0:
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        col = batch.column(idx)
        if col.type != field.type:
            if pa.types.is_decimal(col.type) and pa.types.is_string(field.type):
                col = decimal_plain_text(col)  # Arrow's cast may write an exponent
            elif pa.types.is_time(col.type) or pa.types.is_interval(col.type):
                col = pc.cast(col, pa.string()) if pa.types.is_time(col.type) else _text(col)
            else:
                col = pc.cast(col, field.type, safe=not pa.types.is_timestamp(field.type))
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _text(col: pa.Array) -> pa.Array:
    # Intervals have no Arrow cast to text; their Python form is exact.
    return pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())


def _naive_times(t: pa.DataType) -> bool:
    """Whether ``t`` is, or holds, a timestamp without a time zone (Delta's timestamp_ntz)."""
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_struct(t):
        return any(_naive_times(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _naive_times(t.key_type) or _naive_times(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _naive_times(t.value_type)
    return False


def allow_naive_times(dt: Any, schema: pa.Schema) -> bool:
    """Give table ``dt`` Delta's ``timestampNtz`` feature when ``schema`` brings it its first
    timestamp without a time zone; whether it was given (a commit of its own).

    A table created with such a column has it; one that gains its first (a
    column added, or retyped) refused every write after: "Table contains
    TIMESTAMP_NTZ columns but does not have the required 'timestampNtz'
    feature".
    """
    from deltalake import TableFeatures

    if not any(_naive_times(f.type) for f in schema):
        return False
    if any(_naive_times(f.type) for f in pa.schema(dt.schema().to_arrow())):
        return False  # (the table has the feature: it holds such a column)
    dt.alter.add_feature(
        TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True
    )
    return True
