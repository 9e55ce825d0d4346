"""Deliveries: bounded Parquet files under a run-scoped staging area."""

from combined.delivery._staging import (
    Limits,
    PartWriter,
    StagedDelivery,
    StagingArea,
    delivery_id,
    file_hash,
    write_deliveries,
)

__all__ = [
    "Limits",
    "PartWriter",
    "StagedDelivery",
    "StagingArea",
    "delivery_id",
    "file_hash",
    "write_deliveries",
]
