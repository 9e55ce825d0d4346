"""The MariaDB/MySQL connector (registered as ``mariadb`` and ``mysql``).

Reads tables and views through PyMySQL's unbuffered cursor as bounded Arrow
batches, each read in one ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ
ONLY`` transaction. Strategies: ``snapshot``, ``cursor`` and ``cdc`` (the
row-based binary log, through ``mysql-replication``). See
``docs/mariadb.md``.
"""

from combined.connectors._shared import ControlTotals
from combined.connectors.mariadb._extract import (
    CONSISTENT_SNAPSHOT,
    SERVER_CLOCK,
    MariaDBExtraction,
)
from combined.connectors.mariadb._source import MariaDBSource, MySQLSource

__all__ = [
    "CONSISTENT_SNAPSHOT",
    "SERVER_CLOCK",
    "ControlTotals",
    "MariaDBExtraction",
    "MariaDBSource",
    "MySQLSource",
]
