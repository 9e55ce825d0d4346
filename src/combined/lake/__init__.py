"""The lake: Delta commit protocol, layout, types and the published-basis query."""

from combined.lake._files import (
    LARGE_ROW_BYTES,
    ROW_GROUP_ROWS,
    FileStats,
    RowGroups,
    constant_dictionary,
    dictionary_columns_taken,
    link_data_files,
    link_or_copy,
    linked_name,
    parquet_writer,
    with_dictionaries,
)
from combined.lake._layout import LakeLayout, confined
from combined.lake._store import LakeStore
from combined.lake._table import (
    METADATA_KEY,
    CommitMode,
    CommitResult,
    LakeTable,
    shared_loads,
)
from combined.lake._types import lake_schema, lake_type, to_lake

__all__ = [
    "METADATA_KEY",
    "LARGE_ROW_BYTES",
    "ROW_GROUP_ROWS",
    "CommitMode",
    "CommitResult",
    "FileStats",
    "LakeLayout",
    "LakeStore",
    "LakeTable",
    "RowGroups",
    "confined",
    "constant_dictionary",
    "dictionary_columns_taken",
    "lake_schema",
    "lake_type",
    "link_data_files",
    "link_or_copy",
    "linked_name",
    "with_dictionaries",
    "parquet_writer",
    "shared_loads",
    "to_lake",
]
