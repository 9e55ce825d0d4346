"""The files connector (registered as ``files``).

Reads local CSV, Parquet and JSON files under one directory with DuckDB, as
bounded Arrow batches. Strategy: ``snapshot``, over a listing of the files
that is checked unchanged once every row is read. See :class:`FilesSource`
for the configuration and ``docs/files.md``.
"""

from combined.connectors.files._extraction import FilesExtraction
from combined.connectors.files._settings import FileSet, Settings
from combined.connectors.files._source import FilesSource

__all__ = ["FileSet", "FilesExtraction", "FilesSource", "Settings"]
