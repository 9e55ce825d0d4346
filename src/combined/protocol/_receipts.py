"""Extraction receipts and terminal outcomes.

An :class:`ExtractionAuthority` owns the current immutable
:class:`ExtractionReceipt` of one source read. Each change replaces the receipt
with a new frozen value, so a receipt already handed to another component
never changes under it. ``extraction_completed_at`` stays ``None`` until every
row and byte was consumed and counted.

An extraction accepts exactly one :data:`TerminalOutcome`; the first decision
wins and repeats return the same :class:`TerminalReceipt`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from combined.errors import ProtocolViolation

TerminalOutcome = Literal["success", "abort", "retain_commit_unknown"]

#: The clock of the engine's own process, used when no source clock is known.
ENGINE_CLOCK = "combined.utc"


def utcnow() -> datetime:
    """The engine clock: an aware UTC timestamp."""
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ExtractionReceipt:
    """Immutable evidence of one source read."""

    extraction_started_at: datetime | None = None
    extraction_completed_at: datetime | None = None
    clock_authority: str = ENGINE_CLOCK
    snapshot_acquired_at: datetime | None = None
    snapshot_authority: str | None = None
    source_token: str | None = None
    rows: int = 0
    bytes: int = 0

    @property
    def acquired(self) -> bool:
        """Whether the source read has started."""
        return self.extraction_started_at is not None

    @property
    def completed(self) -> bool:
        """Whether every row and byte of the read was consumed and counted."""
        return self.extraction_completed_at is not None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (timestamps as ISO-8601 text)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.isoformat() if isinstance(value, datetime) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExtractionReceipt:
        """Rebuild a receipt written by :meth:`to_json`."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name.endswith("_at") and isinstance(value, str):
                value = datetime.fromisoformat(value)
            kwargs[f.name] = value
        return cls(**kwargs)


def snapshot_token_digest(token: str) -> str:
    """The published form of a server-issued snapshot token: its digest."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


class ExtractionAuthority:
    """The single owner of an extraction's receipt.

    ``clock`` issues the window timestamps; ``clock_authority`` names it. A
    connector calls :meth:`acquire` at the truthful start of the source read,
    :meth:`acquire_snapshot` only once a real server snapshot exists,
    :meth:`count` as it hands records over and :meth:`complete` after it has
    proven exhaustion.
    """

    def __init__(
        self,
        clock_authority: str = ENGINE_CLOCK,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._receipt = ExtractionReceipt(clock_authority=clock_authority)

    @property
    def receipt(self) -> ExtractionReceipt:
        """The latest frozen receipt."""
        return self._receipt

    def acquire(self, at: datetime | None = None) -> ExtractionReceipt:
        """Mark the start of the source read; a second call keeps the first start."""
        with self._lock:
            if self._receipt.extraction_started_at is None:
                self._receipt = dataclasses.replace(
                    self._receipt, extraction_started_at=at or self._clock()
                )
            return self._receipt

    def acquire_snapshot(
        self, authority: str, token: str, at: datetime | None = None
    ) -> ExtractionReceipt:
        """Record a real server snapshot (``token`` is published only as a digest)."""
        with self._lock:
            if self._receipt.extraction_started_at is None:
                raise ProtocolViolation("a snapshot cannot be acquired before the read started")
            if self._receipt.snapshot_authority is not None:
                raise ProtocolViolation("the extraction already holds a snapshot")
            self._receipt = dataclasses.replace(
                self._receipt,
                snapshot_acquired_at=at or self._clock(),
                snapshot_authority=authority,
                source_token=snapshot_token_digest(token),
            )
            return self._receipt

    def count(self, rows: int, nbytes: int = 0) -> None:
        """Add consumed rows and bytes to the receipt."""
        with self._lock:
            if self._receipt.extraction_completed_at is not None:
                raise ProtocolViolation("rows counted after the extraction completed")
            self._receipt = dataclasses.replace(
                self._receipt,
                rows=self._receipt.rows + rows,
                bytes=self._receipt.bytes + nbytes,
            )

    def complete(self, at: datetime | None = None) -> ExtractionReceipt:
        """Close the window once every row and byte was consumed; idempotent."""
        with self._lock:
            if self._receipt.extraction_started_at is None:
                raise ProtocolViolation("an extraction cannot complete before it started")
            if self._receipt.extraction_completed_at is None:
                self._receipt = dataclasses.replace(
                    self._receipt, extraction_completed_at=at or self._clock()
                )
            return self._receipt


@dataclass(frozen=True, slots=True)
class TerminalReceipt:
    """The one terminal decision an extraction accepted."""

    outcome: TerminalOutcome
    decided_at: datetime
    cleanup_succeeded: bool
    cleanup_error_code: str | None = None
    retained_paths: tuple[str, ...] = ()
    receipt: ExtractionReceipt | None = None
