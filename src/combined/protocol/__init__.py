"""Records, state messages, receipts, outcomes, identity and provenance."""

from combined.protocol._messages import (
    EMITTED_AT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    ChangeKind,
    Message,
    RecordBatchMessage,
    StateMessage,
)
from combined.protocol._receipts import (
    ENGINE_CLOCK,
    ExtractionAuthority,
    ExtractionReceipt,
    TerminalOutcome,
    TerminalReceipt,
    snapshot_token_digest,
    utcnow,
)

__all__ = [
    "EMITTED_AT_COLUMN",
    "ENGINE_CLOCK",
    "OP_COLUMN",
    "POSITION_COLUMN",
    "ChangeKind",
    "ExtractionAuthority",
    "ExtractionReceipt",
    "Message",
    "RecordBatchMessage",
    "StateMessage",
    "TerminalOutcome",
    "TerminalReceipt",
    "snapshot_token_digest",
    "utcnow",
]
