"""What a connector yields while it reads: record batches and state messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pyarrow as pa

#: The change a record states. ``upsert`` is a full-row observation (snapshot,
#: cursor) whose effect is decided against the current state at the commit
#: boundary; ``insert``/``update``/``delete`` are stated by the provider (CDC).
ChangeKind = Literal["upsert", "insert", "update", "delete"]

#: Optional columns a connector may add to its batches to state the change of
#: each row and the provider's emission time and position.
OP_COLUMN = "_combined_op"
EMITTED_AT_COLUMN = "_combined_emitted_at"
POSITION_COLUMN = "_combined_source_position"


@dataclass(frozen=True, slots=True)
class RecordBatchMessage:
    """A bounded Arrow batch of records of one dataset.

    The batch holds the source's own columns. A change stream (CDC) adds
    ``_combined_op`` (``insert``/``update``/``delete``), and may add
    ``_combined_emitted_at`` and ``_combined_source_position``; a batch without
    ``_combined_op`` is a set of full-row observations (``upsert``).
    """

    dataset: str
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class StateMessage:
    """A provider checkpoint emitted after the records it covers.

    ``state`` is JSON-serialisable and is handed back to the connector on the
    next read. ``position`` is the provider-native position as text (cursor
    value, LSN) used for freshness and the ``_combined_source_position``
    column. ``final`` marks the last state of a bounded read.
    """

    dataset: str
    state: Mapping[str, Any]
    position: str | None = None
    emitted_at: str | None = None
    final: bool = field(default=False)


Message = RecordBatchMessage | StateMessage
