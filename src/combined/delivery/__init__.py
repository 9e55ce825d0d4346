"""Deliveries: bounded Parquet files under a run-scoped staging area (and the staged parts)."""

from combined.delivery._parts import (
    COPY_BATCH_BYTES,
    ELEMENT_BYTES,
    VECTOR_ROWS,
    PartWriter,
    StagedParts,
    part_batches,
    part_schema,
    read_part,
    read_part_batch,
    read_staged,
    rows_within,
    scan_weight,
)
from combined.delivery._staging import (
    CHUNK_BYTES,
    Limits,
    StagedDelivery,
    StagingArea,
    delivery_id,
    file_hash,
    write_deliveries,
)

__all__ = [
    "CHUNK_BYTES",
    "COPY_BATCH_BYTES",
    "ELEMENT_BYTES",
    "VECTOR_ROWS",
    "Limits",
    "PartWriter",
    "StagedDelivery",
    "StagedParts",
    "StagingArea",
    "delivery_id",
    "file_hash",
    "part_batches",
    "part_schema",
    "read_part",
    "read_staged",
    "read_part_batch",
    "rows_within",
    "scan_weight",
    "write_deliveries",
]
