"""The PostgreSQL connector (registered as ``postgres``).

Reads relations through the ADBC PostgreSQL driver as bounded Arrow batches,
each read in one ``REPEATABLE READ READ ONLY`` transaction whose snapshot is
recorded on the extraction receipt. Strategies: ``snapshot`` and ``cursor``,
plus partitioned backfill under one exported snapshot
(:meth:`PostgresSource.plan_partitions`, :meth:`PostgresSource.read_partition`).
"""

from combined.connectors._shared import ControlTotals
from combined.connectors.postgres._extract import (
    CURRENT_SNAPSHOT,
    EXPORTED_SNAPSHOT,
    SERVER_CLOCK,
    PostgresExtraction,
)
from combined.connectors.postgres._partition import Partition, PartitionPlan
from combined.connectors.postgres._source import PostgresSource

__all__ = [
    "CURRENT_SNAPSHOT",
    "EXPORTED_SNAPSHOT",
    "SERVER_CLOCK",
    "ControlTotals",
    "Partition",
    "PartitionPlan",
    "PostgresExtraction",
    "PostgresSource",
]
