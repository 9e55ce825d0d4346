"""A reduced transition: its counts and digests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

_LOW64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Transition:
    """The counts and digests of one reduced transition."""

    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    unchanged: int = 0
    captured: int = 0
    digest: str = "0" * 32
    content_xor: tuple[int, int] = (0, 0)
    #: The events an event stream's new snapshot appends (``capture._resnapshot``):
    #: its changes; None: every captured row is one (``captured``).
    events: int | None = None

    @property
    def appended(self) -> int:
        """How many events an event stream's (``append``) transition adds to its table."""
        return self.captured if self.events is None else self.events

    @property
    def changes(self) -> int:
        """How many identities the transition changes."""
        return self.inserts + self.updates + self.deletes


def _hex128(value: int) -> str:
    """A 128-bit digest as 32 hex digits, high half first."""
    return f"{value >> 64:016x}{value & _LOW64:016x}"


def _halves(value: int) -> tuple[int, int]:
    """A 128-bit value as its (low, high) 64-bit halves."""
    return value & _LOW64, value >> 64


#: The operations a transition digest folds apart, in the order its text lists them.
DIGEST_CLASSES = ("insert", "snapshot", "update", "delete", "truncate")


def transition_digest(folds: dict[str, int | None]) -> str:
    """The digest of a transition from the xor of its rows' terms, one fold per operation.

    ``folds`` maps an operation to the bit_xor of its rows' md5 terms: for a
    put (insert, snapshot, update), md5 of ``id|new hash`` (the term the
    content digest adds, so a first baseline hashes each row once); for a
    delete (or an event stream's truncate), md5 of ``id|hash`` of its own
    row (empty when it has none). Each operation folds apart, so an insert
    and an update of the same row differ; the digest is the md5 of the
    labelled folds (``t2|insert:<32 hex>|snapshot:...``). No changes digest
    to 32 zeros.
    """
    values = [int(folds.get(op) or 0) for op in DIGEST_CLASSES]
    if not any(values):
        return "0" * 32
    text = "t2|" + "|".join(
        f"{op}:{_hex128(v)}" for op, v in zip(DIGEST_CLASSES, values, strict=True)
    )
    return hashlib.md5(text.encode("ascii"), usedforsecurity=False).hexdigest()
