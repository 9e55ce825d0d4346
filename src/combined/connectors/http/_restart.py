"""Starting an endpoint's pages over after its page token expired, without handing a key twice.

Cursor and link paging hold the read's position in a token the API may
expire before the read ends (a 410, or an error the endpoint declares in
``paginate.expired``). The records already handed over cannot be taken back,
so the read starts its pages over from where it started (the committed
checkpoint, for a cursor read) and hands over only the keys it has not
handed over yet. :class:`Delivered` remembers each key handed over (a digest
of it, with a digest of its record) from the first page on, as a restart
may come at any page: 24 bytes a record, written to a temporary file of the
read's own, so a read's memory does not grow with its records. Only a
restart reads them back, sorted, into memory (24 bytes a record then).

A record read again with other values than the version handed over changed
meanwhile: its first version stays in this capture, and
:attr:`Delivered.changed` keeps a cursor read's checkpoint where it was, so
the next read asks for it again. (A snapshot brings the change at its next
capture.)
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from combined.connectors._subprocess._schema import json_encoder
from combined.connectors.http._settings import Endpoint
from combined.errors import SourceUnavailable

#: A value's JSON text with sorted keys: equal for equal records, whatever their keys' order.
canonical = json_encoder(sort_keys=True)


def _digest(value: Any, size: int) -> bytes:
    return hashlib.blake2b(canonical(value).encode(), digest_size=size).digest()


class Delivered:
    """The keys one read handed over, for the pages a restart reads again."""

    def __init__(self, key: Sequence[str], endpoint: Endpoint) -> None:
        self.key = tuple(key)
        #: Keys are remembered only when a restart may come: cursor or link paging
        #: that may start over, and a key to tell the records read twice.
        self.tracking = (
            bool(self.key)
            and endpoint.paginate.restarts > 0
            and endpoint.paginate.style in ("cursor", "link")
        )
        self.restarts = 0
        #: Whether a record read again after a restart differed from the one handed over.
        self.changed = False
        #: The key and record digests handed over since the last restart (a private file).
        self._handed: IO[bytes] | None = None
        #: Those handed over before it, sorted by key (None before any restart).
        self._known: _Known | None = None

    def admit(self, record: Mapping[str, Any]) -> bool:
        """Whether to hand ``record`` over: every record before a restart, after one those
        whose key was not handed over before it (a key repeated within one pass is the
        engine's to refuse)."""
        if not self.tracking:
            return True
        key = _digest([record.get(k) for k in self.key], 16)
        body = _digest(record, 8)
        if self._known is not None and (before := self._known.body(key)) is not None:
            self.changed |= before != int.from_bytes(body, "big")
            return False
        if self._handed is None:
            self._handed = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._handed.write(key + body)
        return True

    def close(self) -> None:
        """Drop the remembered digests (the read ended)."""
        if self._handed is not None:
            self._handed.close()
            self._handed = None
        self._known = None

    def restart(self, endpoint: Endpoint, expired: SourceUnavailable, page: int) -> None:
        """Count a restart after ``expired`` on ``page``; raise once none is left."""
        paging = endpoint.paginate
        if not self.key or self.restarts >= paging.restarts:
            tried = f", after starting over {self.restarts} times" if self.restarts else ""
            why = (
                "the dataset declares no key to tell the records read twice"
                if not self.key
                else f"paginate.restarts is {paging.restarts}"
            )
            raise SourceUnavailable(
                f"endpoint {endpoint.name!r}: the page token of page {page} expired before "
                f"the read ended{tried} ({expired.message}): nothing was committed",
                hint=f"the read is retried; the API's tokens expire sooner than a read "
                f"takes: ask for larger pages, lower other load on the API, or raise "
                f"config.endpoints.{endpoint.name}.paginate.restarts ({why})",
                endpoint=endpoint.name,
                page=page,
            ) from expired
        self.restarts += 1
        if self._handed is not None:
            self._handed.seek(0)
            self._known = _Known.of(self._handed.read(), self._known)
            self._handed.seek(0)
            self._handed.truncate()


@dataclass(frozen=True)
class _Known:
    """Keys handed over before a restart, sorted: the digest's halves, and the record's."""

    high: np.ndarray[Any, np.dtype[np.uint64]]
    low: np.ndarray[Any, np.dtype[np.uint64]]
    bodies: np.ndarray[Any, np.dtype[np.uint64]]

    @classmethod
    def of(cls, handed: bytes, earlier: _Known | None) -> _Known:
        """The keys of ``handed`` (24 bytes each) with ``earlier``'s: each key's first record."""
        rows = np.frombuffer(handed, dtype=_ROW)
        high, low, bodies = (rows[name].astype(np.uint64) for name in _ROW.names or ())
        if earlier is not None:  # (first: a key's oldest record is the one kept)
            high = np.concatenate([earlier.high, high])
            low = np.concatenate([earlier.low, low])
            bodies = np.concatenate([earlier.bodies, bodies])
        order = np.lexsort((low, high))  # (stable: equal keys keep their order)
        high, low, bodies = high[order], low[order], bodies[order]
        first = np.ones(len(high), dtype=bool)
        first[1:] = (high[1:] != high[:-1]) | (low[1:] != low[:-1])
        return cls(high[first], low[first], bodies[first])

    def body(self, key: bytes) -> int | None:
        """The digest of the record handed over under ``key``; None if none was."""
        high, low = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
        value = np.uint64(high)
        start = int(np.searchsorted(self.high, value, side="left"))
        end = int(np.searchsorted(self.high, value, side="right"))
        for at in range(start, end):
            if int(self.low[at]) == low:
                return int(self.bodies[at])
        return None


#: A remembered key as written: its digest's two halves and the record's digest.
_ROW = np.dtype([("high", ">u8"), ("low", ">u8"), ("body", ">u8")])


__all__ = ["Delivered", "canonical"]
