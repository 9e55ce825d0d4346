"""The checkpoint barrier: a state may advance only past committed records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CheckpointBarrier:
    """Tracks state messages against the records emitted before them.

    Records are counted in stream order; each state message is pinned to the
    count of records before it. :meth:`committable` returns the newest state
    whose records are all within the committed prefix, so a checkpoint never
    runs ahead of committed data.
    """

    def __init__(self) -> None:
        self._records = 0
        self._states: list[tuple[int, Mapping[str, Any], str | None]] = []

    def records(self, n: int) -> None:
        """Count ``n`` records emitted in stream order."""
        if n < 0:
            raise ValueError("a record count cannot be negative")
        self._records += n

    def state(self, state: Mapping[str, Any], position: str | None = None) -> None:
        """Pin a state message after the records emitted so far."""
        self._states.append((self._records, dict(state), position))

    @property
    def emitted(self) -> int:
        """Records emitted so far."""
        return self._records

    def committable(self, through_records: int) -> tuple[Mapping[str, Any], str | None] | None:
        """The newest state whose preceding records are all committed."""
        best = None
        for barrier, state, position in self._states:
            if barrier <= through_records:
                best = (state, position)
            else:
                break
        return best
