"""A commit's rows shaped to its table: the columns it lacks, the types it changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from combined.lake._types import to_lake

__all__ = ["_conformed", "_retyped", "_union"]


def _union(current: pa.Schema, incoming: pa.Schema) -> pa.Schema:
    """The table's columns in its order (in ``incoming``'s types), then ``incoming``'s new ones."""
    types = {f.name: f.type for f in incoming}
    fields = [pa.field(f.name, types.get(f.name, f.type), True) for f in current]
    return pa.schema(fields + [f for f in incoming if f.name not in current.names])


def _conformed(
    dt: Any, data: Callable[[], pa.RecordBatchReader]
) -> Callable[[], pa.RecordBatchReader]:
    """``data`` with every column of the table, null where the Deliveries lack it."""
    current = pa.schema(dt.schema().to_arrow())

    def conformed() -> pa.RecordBatchReader:
        reader = data()
        if all(name in reader.schema.names for name in current.names):
            return reader
        target = _union(current, reader.schema)
        return pa.RecordBatchReader.from_batches(target, (to_lake(b, target) for b in reader))

    return conformed


def _retyped(dt: Any, schema: pa.Schema) -> bool:
    """Whether ``schema`` gives a column of the table another type."""
    current = {f.name: f.type for f in pa.schema(dt.schema().to_arrow())}
    return any(f.name in current and current[f.name] != f.type for f in schema)
