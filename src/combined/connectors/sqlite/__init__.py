"""The SQLite connector (registered as ``sqlite``).

Reads a SQLite database file through the ADBC SQLite driver as Arrow batches,
read-only, each read in one read transaction. Strategies: ``snapshot`` and
``cursor``. See :class:`SQLiteSource` for the configuration.
"""

from combined.connectors.sqlite._extraction import SQLiteExtraction
from combined.connectors.sqlite._source import SQLiteSource
from combined.connectors.sqlite._types import column_type

__all__ = ["SQLiteExtraction", "SQLiteSource", "column_type"]
