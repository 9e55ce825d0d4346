"""What ``pg_replication_slots`` says of one slot (:class:`SlotStatus`), with its lag.

Read by ``_replication.slot_status``; ``combined cdc status``, the slot alerts
and ``/metrics`` show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from combined.connectors.postgres._pgoutput import lsn_to_text

__all__ = ["SlotStatus"]


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """What ``pg_replication_slots`` says about one slot, with its lag.

    ``lag_bytes`` is the server's current WAL position minus
    ``confirmed_flush_lsn``: the WAL retained for this slot that the lake has
    not acknowledged. ``lag_seconds`` is the server's ``flush_lag`` of the
    active walsender, when one is streaming.
    """

    slot: str
    exists: bool
    plugin: str | None = None
    database: str | None = None
    active: bool = False
    active_pid: int | None = None
    restart_lsn: int | None = None
    confirmed_flush_lsn: int | None = None
    wal_status: str | None = None
    safe_wal_size: int | None = None
    current_lsn: int | None = None
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    wal_keep_limit: int | None = None
    wal_rate: float | None = None
    #: The database of the connection that read the status (the source's).
    connected_to: str | None = None
    #: The server's ``wal_level``: no logical slot streams unless it is ``logical``.
    wal_level: str | None = None

    @property
    def keeps_for_seconds(self) -> float | None:
        """How long the source keeps this slot's WAL at the current rate (None: no limit).

        ``safe_wal_size`` (what may still be written before the slot loses
        WAL, under ``max_slot_wal_keep_size``) over the server's average WAL
        rate since its statistics were reset (``pg_stat_wal``).
        """
        if self.safe_wal_size is None or not self.wal_rate:
            return None
        return max(self.safe_wal_size, 0) / self.wal_rate

    @property
    def lost(self) -> bool:
        """Whether the slot can no longer stream every change since it was confirmed."""
        return not self.exists or self.wal_status == "lost" or self.restart_lsn is None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping, LSNs as ``X/Y`` text."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name.endswith("_lsn") and isinstance(value, int):
                value = lsn_to_text(value)
            out[name] = value
        out["keeps_for_seconds"] = self.keeps_for_seconds
        return out
