"""Deliveries: bounded Parquet files under a run-scoped staging area (and the staged parts)."""

from combined.delivery._staging import (
    CHUNK_BYTES,
    COPY_BATCH_BYTES,
    ELEMENT_BYTES,
    Limits,
    PartWriter,
    StagedDelivery,
    StagedParts,
    StagingArea,
    delivery_id,
    file_hash,
    part_batches,
    part_schema,
    read_part,
    read_part_batch,
    write_deliveries,
)

__all__ = [
    "CHUNK_BYTES",
    "COPY_BATCH_BYTES",
    "ELEMENT_BYTES",
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
    "read_part_batch",
    "write_deliveries",
]
